#!/usr/bin/env bash
# NoPE layers from the command line (--no-rope-freq, Megatron's; Llama 4's and SmolLM3's): a rotary
# model whose every second layer skips the rotation trains, records the pattern in its checkpoint,
# resumes to the straight run's losses (and by --use-checkpoint-args), refuses to resume without the
# flag, generates the same text with and without the KV cache, and converts to HuggingFace SmolLM3 and
# back generating the same text; a list
# expression gives the integer's pattern; bad values and combinations are one-line errors naming the
# flag, with nothing written.
#   bash tests/e2e/test_no_rope_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MODEL=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear --seq-length 32
       --max-position-embeddings 32 --tokenizer-type ByteTokenizer)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MODEL[@]}" --no-rope-freq 2 "${RUN[@]}" --train-iters 24 --exit-interval 20 \
     --save ckpt --metrics-file m.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "a model with NoPE layers trains: lm loss $first -> $last" || fail "the loss did not fall: $first -> $last"
  squeezed_has ckpt/iter_0000020/checkpoint.json -- '"no_rope_freq":[0,1,0,1]' &&
    pass "the checkpoint records the pattern [0,1,0,1]" || fail "the checkpoint lost --no-rope-freq"
  if run resume "$LATTICE" train "${MODEL[@]}" --no-rope-freq "([0]+[1])*2" "${RUN[@]}" --train-iters 24 --load ckpt \
       --save ckpt --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" --no-rope-freq 2 "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    expect_resumed_losses "resumed with the list form of the same pattern: the straight run's losses" s.jsonl r.jsonl 4
  fi
  expect_error "resume without --no-rope-freq" "no_rope_freq|--no-rope-freq" -- \
    "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt3
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 24 --load ckpt --ckpt-step 20 \
    --save ckpt2 --exit-interval 21 && squeezed_has ckpt2/iter_0000021/checkpoint.json -- '"no_rope_freq":[0,1,0,1]' &&
    pass "--use-checkpoint-args resumes the NoPE layers" || fail "--use-checkpoint-args lost --no-rope-freq"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 --no-kv-cache &&
    { [ -s gen.out ] && cmp -s gen.out gen_full.out &&
        pass "generate prints the same text with and without the KV cache" ||
        fail "generate differs with and without the KV cache"; }
  # A Llama-shaped model with NoPE layers is HuggingFace SmolLM3 (no_rope_layers: 1 rotary, 0 NoPE), and back.
  if run to_hf "$LATTICE" convert --load ckpt --to-hf hf && run from_hf "$LATTICE" convert --from-hf hf --save ckpt_hf &&
     run gen_hf "$LATTICE" generate --load ckpt_hf --prompt "ab" --max-new-tokens 24 --seed 2; then
    squeezed_has hf/config.json -- '"model_type":"smollm3"' &&
      squeezed_has hf/config.json -- '"no_rope_layers":[1,0,1,0]' &&
      squeezed_has hf/config.json -- '"no_rope_layer_interval":2' &&
      pass "convert --to-hf writes SmolLM3 (no_rope_layers [1,0,1,0], interval 2)" ||
      fail "convert --to-hf did not write the NoPE layers as SmolLM3: $(tr -d ' \n' < hf/config.json)"
    cmp -s gen.out gen_hf.out && pass "out to SmolLM3 and back, generate prints the same text" ||
      fail "the model converted out and back generates another text"
  fi
fi

# The pattern changes the model from the first loss: against every layer rotating.
if run plain "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 1 --metrics-file p.jsonl; then
  [ "$(field p.jsonl lm_loss)" != "$(field m.jsonl lm_loss | head -n 1)" ] &&
    pass "the NoPE layers change the first loss ($(field p.jsonl lm_loss) with the rotation everywhere)" ||
    fail "the first loss is the same with and without the NoPE layers"
fi

expect_error "a period not dividing the layers" "--no-rope-freq 3 does not divide --num-layers 4" -- \
  "$LATTICE" train "${MODEL[@]}" --no-rope-freq 3 "${RUN[@]}" --train-iters 1 --save bad1
expect_error "a list of the wrong length" "--no-rope-freq '[0,1]' has 2 entries for --num-layers 4" -- \
  "$LATTICE" train "${MODEL[@]}" --no-rope-freq "[0,1]" "${RUN[@]}" --train-iters 1 --save bad2
expect_error "learned positions" "--no-rope-freq needs the rotary embedding" -- \
  "$LATTICE" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
  --max-position-embeddings 16 --tokenizer-type ByteTokenizer --no-rope-freq 2 "${RUN[@]}" --train-iters 1 --save bad3
[ -e bad1 ] || [ -e bad2 ] || [ -e bad3 ] || [ -e ckpt3 ] && fail "a refused run left a checkpoint behind"
e2e_finish
