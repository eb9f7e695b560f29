#!/usr/bin/env bash
# Gated attention from the command line (--attention-output-gate, Qwen3-Next's): a Qwen3-style model (rope,
# grouped-query attention, --qk-layernorm, RMSNorm, SwiGLU, no biases) with the gate trains, saves
# linear_qkv with the gates' rows and the flag, resumes to the straight run's losses (and by
# --use-checkpoint-args), refuses to resume without the flag, generates the same text with and without
# the KV cache, and has no HuggingFace form (refused, nothing written); the gate does not go with
# --multi-latent-attention. Errors are one line naming the flag.
#   bash tests/e2e/test_gated_attention_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MODEL=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --kv-channels 16 --position-embedding-type rope --qk-layernorm --normalization RMSNorm --swiglu
       --disable-bias-linear --seq-length 32 --max-position-embeddings 32 --tokenizer-type ByteTokenizer)
GATE=(--attention-output-gate)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MODEL[@]}" "${GATE[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "a gated-attention model trains: lm loss $first -> $last" || fail "the loss did not fall: $first -> $last"
  # linear_qkv [(2 x 4 heads + 2 x 2 groups) x 16, 32]: the gates' 64 rows beside the queries'.
  header=$(head -c 65536 ckpt/iter_0000020/model.safetensors | tr -d '\0')
  grep -q '"attention_output_gate": *true' ckpt/iter_0000020/checkpoint.json &&
    grep -aqF '"decoder.layers.0.self_attention.linear_qkv.weight":{"data_offsets":' <<<"$header" &&
    grep -aoE '"decoder.layers.0.self_attention.linear_qkv.weight":\{[^}]*\}' <<<"$header" |
      grep -qF '"shape":[192,32]' &&
    pass "the checkpoint records the gate and linear_qkv's gate rows ([192, 32])" ||
    fail "the checkpoint lost the gate or its rows"
  if run resume "$LATTICE" train "${MODEL[@]}" "${GATE[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt \
       --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" "${GATE[@]}" "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    expect_resumed_losses "the resumed run's losses are the straight run's" s.jsonl r.jsonl 4
  fi
  expect_error "resume without --attention-output-gate" "attention_output_gate|--attention-output-gate" -- \
    "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt3
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 24 --load ckpt --ckpt-step 20 \
    --save ckpt2 --exit-interval 21 && grep -q '"attention_output_gate": *true' ckpt2/iter_0000021/*.json &&
    pass "--use-checkpoint-args resumes the gated model" || fail "--use-checkpoint-args lost the gate"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 --no-kv-cache &&
    { [ -s gen.out ] && cmp -s gen.out gen_full.out &&
        pass "generate prints the same text with and without the KV cache" ||
        fail "generate differs with and without the KV cache"; }
  expect_error "convert --to-hf of a gated model" "--attention-output-gate|HuggingFace" -- \
    "$LATTICE" convert --load ckpt --to-hf hf
  [ -e hf ] && fail "the refused conversion left hf/ behind"
fi

# The gate changes the model: the same seed's first loss differs without it.
if run plain "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 1 --metrics-file p.jsonl; then
  [ "$(field p.jsonl lm_loss)" != "$(field m.jsonl lm_loss | head -n 1)" ] &&
    pass "the gate changes the first loss ($(field p.jsonl lm_loss) without it)" ||
    fail "the first loss is the same with and without the gate"
fi

expect_error "the gate with multi-latent attention" "--attention-output-gate does not go with --multi-latent-attention" -- \
  "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
  --position-embedding-type rope --multi-latent-attention --kv-lora-rank 8 --qk-head-dim 8 --qk-pos-emb-head-dim 4 \
  --v-head-dim 8 --tokenizer-type ByteTokenizer "${GATE[@]}" "${RUN[@]}" --train-iters 1 --save bad1
[ -e bad1 ] || [ -e ckpt3 ] && fail "a refused run left a checkpoint behind"
e2e_finish
