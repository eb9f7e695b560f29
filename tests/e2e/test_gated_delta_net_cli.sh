#!/usr/bin/env bash
# Gated DeltaNet from the command line (--experimental-attention-variant gated_delta_net, Qwen3-Next's
# hybrid): layers 0 and 1 GDN, layer 2 attention (--linear-attention-freq 3) with the output gate and q/k
# norms, a quarter of each head rotated, zero-centered RMSNorm, SwiGLU, no biases: Qwen3.5's form. It
# trains, saves in_proj, conv1d, A_log and dt_bias with the flags, resumes to the straight run's losses (and
# by --use-checkpoint-args), generates the same text with and without the KV cache (the layers' states
# carried), converts to HuggingFace Qwen3.5 and back generating the same text, runs TP 2 x SP and CP 2 as
# one process does, with document masks too; a model without the form is refused (nothing written); a model
# trained from converted Qwen3.5-MoE weights converts back to Qwen3.5-MoE. Errors are one line naming the flag.
#   bash tests/e2e/test_gated_delta_net_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MODEL=(--num-layers 3 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --kv-channels 16 --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
       --attention-output-gate --qk-layernorm --apply-layernorm-1p --rotary-percent 0.25 --seq-length 32 --max-position-embeddings 32 --tokenizer-type ByteTokenizer)
GDN_SHAPE=(--experimental-attention-variant gated_delta_net --linear-num-key-heads 2
     --linear-num-value-heads 4 --linear-key-head-dim 8 --linear-value-head-dim 8 --linear-conv-kernel-dim 4)
GDN=("${GDN_SHAPE[@]}" --linear-attention-freq 3)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "a Gated DeltaNet hybrid trains: lm loss $first -> $last" || fail "the loss did not fall: $first -> $last"
  # in_proj [2 x 2 x 8 + 2 x 4 x 8 + 2 x 4, 32] = [104, 32]; conv1d [2 x 16 + 32, 1, 4] = [64, 1, 4].
  header=$(head -c 65536 ckpt/iter_0000020/model.safetensors | tr -d '\0')
  grep -q '"experimental_attention_variant": *"gated_delta_net"' ckpt/iter_0000020/checkpoint.json &&
    grep -aoE '"decoder.layers.1.self_attention.in_proj.weight":\{[^}]*\}' <<<"$header" | grep -qF '"shape":[104,32]' &&
    grep -aoE '"decoder.layers.0.self_attention.conv1d.weight":\{[^}]*\}' <<<"$header" | grep -qF '"shape":[64,1,4]' &&
    grep -aqF '"decoder.layers.0.self_attention.A_log":' <<<"$header" &&
    grep -aqF '"decoder.layers.2.self_attention.linear_qkv.weight":' <<<"$header" &&
    pass "the checkpoint records the variant, the GDN layers' in_proj [104, 32], conv1d [64, 1, 4] and A_log, layer 2's linear_qkv" ||
    fail "the checkpoint lost the variant or a GDN tensor"
  if run resume "$LATTICE" train "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt \
       --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    expect_resumed_losses "the resumed run's losses are the straight run's" s.jsonl r.jsonl 4
  fi
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 24 --load ckpt --ckpt-step 20 \
    --save ckpt2 --exit-interval 21 &&
    squeezed_has ckpt2/iter_0000021/checkpoint.json -- '"linear_attention_freq":[1,1,0]' &&
    pass "--use-checkpoint-args resumes the hybrid" || fail "--use-checkpoint-args lost the pattern"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 --no-kv-cache &&
    { [ -s gen.out ] && cmp -s gen.out gen_full.out &&
        pass "generate prints the same text with and without the KV cache" ||
        fail "generate differs with and without the KV cache"; }
  if run to_hf "$LATTICE" convert --load ckpt --to-hf hf && run from_hf "$LATTICE" convert --from-hf hf --save back &&
     run gen_back "$LATTICE" generate --load back --prompt "ab" --max-new-tokens 24 --seed 2; then
    grep -q '"model_type": *"qwen3_5_text"' hf/config.json && cmp -s gen.out gen_back.out &&
      pass "convert writes HuggingFace Qwen3.5 and reads it back: the same text" ||
      fail "the Qwen3.5 round trip changed the model or its config"
  fi
fi

# Tensor parallelism splits the heads (with sequence parallelism): one process's losses within fp32 rounding.
if run tp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" --train-iters 8 --tensor-model-parallel-size 2 --sequence-parallel \
     --metrics-file t2.jsonl &&
   run tp1 "$LATTICE" train "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" --train-iters 8 --metrics-file t1.jsonl; then
  expect_close_losses "TP 2 with sequence parallelism: the single process's 8 losses" t2.jsonl t1.jsonl 8
fi

# Context parallelism: each rank runs its share of the GDN layers' heads (one of the 2 key heads) over the whole
# sequences; one process's losses.
if run cp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" --train-iters 8 --context-parallel-size 2 --metrics-file c2.jsonl; then
  expect_close_losses "CP 2: the single process's 8 losses" c2.jsonl t1.jsonl 8
fi

# Document masks (--reset-attention-mask; the mock data's eod is its last token id): the GDN layers' state
# and convolution restart at each document, as the attention's mask does; CP 2, the heads split over the
# whole sequences and their documents, gives one process's losses.
DOCS=(--reset-attention-mask --reset-position-ids --eod-mask-loss)
if run docs1 "$LATTICE" train "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" "${DOCS[@]}" --train-iters 8 \
     --metrics-file d1.jsonl &&
   run docs_cp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${GDN[@]}" "${RUN[@]}" "${DOCS[@]}" --train-iters 8 --context-parallel-size 2 \
     --metrics-file d2.jsonl; then
  expect_close_losses "document masks, CP 2: the single process's 8 losses" d2.jsonl d1.jsonl 8
fi

# A prediction depth (--mtp-num-layers 1) after a last GDN layer is a GDN layer; TP 2 x SP gives one
# process's losses.
MTP=(--linear-attention-freq "[1,0,1]" --mtp-num-layers 1 --untie-embeddings-and-output-weights)
if run mtp1 "$LATTICE" train "${MODEL[@]}" "${GDN_SHAPE[@]}" "${MTP[@]}" "${RUN[@]}" --train-iters 6 --metrics-file p1.jsonl &&
   run mtp_tp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${GDN_SHAPE[@]}" "${MTP[@]}" "${RUN[@]}" --train-iters 6 --tensor-model-parallel-size 2 \
     --sequence-parallel --metrics-file p2.jsonl; then
  expect_close_losses "with a GDN prediction depth, TP 2 x SP: the single process's 6 losses" p2.jsonl p1.jsonl 6
fi

expect_error "GDN without SwiGLU" "needs --swiglu" -- "$LATTICE" train --num-layers 2 --hidden-size 32 \
  --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 --tokenizer-type ByteTokenizer "${GDN[@]}" \
  "${RUN[@]}" --train-iters 1 --save bad1
expect_error "an unknown variant" "--experimental-attention-variant must be gated_delta_net" -- "$LATTICE" train \
  "${MODEL[@]}" --experimental-attention-variant mamba "${RUN[@]}" --train-iters 1 --save bad2
expect_error "value heads not a multiple of the key heads" "--linear-num-key-heads 3 does not divide" -- "$LATTICE" \
  train "${MODEL[@]}" --experimental-attention-variant gated_delta_net --linear-num-key-heads 3 \
  --linear-num-value-heads 4 "${RUN[@]}" --train-iters 1 --save bad3
# A GDN model without Qwen3.5's q/k norms has no HuggingFace form.
PLAIN=()
for a in "${MODEL[@]}"; do [ "$a" = --qk-layernorm ] || PLAIN+=("$a"); done
if run plain_gdn "$LATTICE" train "${PLAIN[@]}" "${GDN[@]}" "${RUN[@]}" \
     --train-iters 2 --save plain; then
  expect_error "convert --to-hf of a GDN model without q/k norms" "--qk-layernorm" -- \
    "$LATTICE" convert --load plain --to-hf hf2
  [ -e hf2 ] && fail "the refused conversion left hf2/ behind"
fi
# --hf-model-type qwen3_5_moe asks for experts, which the dense hybrid has none of.
if [ -d ckpt ]; then
  expect_error "convert --hf-model-type qwen3_5_moe of a dense hybrid" "--hf-model-type qwen3_5_moe: Qwen3.5-MoE has experts" -- \
    "$LATTICE" convert --load ckpt --to-hf hf3 --hf-model-type qwen3_5_moe
  [ -e hf3 ] && fail "the refused conversion left hf3/ behind"
fi
# A checkpoint converted from Qwen3.5-MoE records its model_type, and so does one trained from it: convert
# --to-hf writes Qwen3.5-MoE again without --hf-model-type (not Qwen3-Next, the default for GDN with experts).
if run moe_in "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_qwen3_5_moe_tiny" --save moe_ckpt &&
   run moe_train "$LATTICE" train --use-checkpoint-args --load moe_ckpt --finetune --save moe_trained --mock-data \
     --micro-batch-size 2 --global-batch-size 2 --train-iters 1 --lr 1e-4 --eval-iters 0 &&
   run moe_out "$LATTICE" convert --load moe_trained --to-hf moe_hf &&
   run moe_next "$LATTICE" convert --load moe_trained --to-hf moe_next_hf --hf-model-type qwen3_next; then
  grep -q '"hf-model-type": *"qwen3_5_moe"' moe_trained/iter_0000001/checkpoint.json &&
    grep -q '"model_type": *"qwen3_5_moe_text"' moe_hf/config.json && grep -q 'Qwen3.5-MoE' moe_out.err &&
    grep -q '"model_type": *"qwen3_next"' moe_next_hf/config.json &&
    pass "a model trained from converted Qwen3.5-MoE weights goes back to HuggingFace as Qwen3.5-MoE (Qwen3-Next when asked)" ||
    fail "the converted Qwen3.5-MoE lost its family on the way back"
fi
[ -e bad1 ] || [ -e bad2 ] || [ -e bad3 ] || [ -e bad4 ] && fail "a refused run left a checkpoint behind"
e2e_finish
