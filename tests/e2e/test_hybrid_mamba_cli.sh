#!/usr/bin/env bash
# Hybrid Mamba models from the command line (--hybrid-override-pattern, Megatron-Core's MambaModel; Nemotron-H's
# form: Mamba-2 layers, attention-only and MLP-only layers, RMSNorm, squared ReLU, no biases, no position
# embedding). It trains, saves the Mamba layers' tensors under Megatron's names and the pattern, resumes to the
# straight run's losses (and by --use-checkpoint-args), generates, converts to HuggingFace Nemotron-H and back
# generating the same text, runs TP 2 x SP, PP 2 and document masks as one process does; a hybrid without
# Nemotron-H's form is refused by convert --to-hf (nothing written); errors are one line naming the flag.
#   bash tests/e2e/test_hybrid_mamba_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MODEL=(--hybrid-override-pattern "M-M*-" --num-layers 5 --hidden-size 32 --num-attention-heads 4
       --position-embedding-type none --normalization RMSNorm --squared-relu --disable-bias-linear
       --mamba-num-heads 8 --mamba-head-dim 8 --mamba-num-groups 2 --mamba-state-dim 8
       --seq-length 32 --max-position-embeddings 32 --tokenizer-type ByteTokenizer)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' &&
    pass "a hybrid Mamba model trains: lm loss $first -> $last" || fail "the loss did not fall: $first -> $last"
  # in_proj [2 x 64 + 2 x 2 x 8 + 8, 32] = [168, 32]; conv1d [64 + 2 x 2 x 8, 1, 4] = [96, 1, 4].
  header=$(head -c 65536 ckpt/iter_0000020/model.safetensors | tr -d '\0')
  squeezed_has ckpt/iter_0000020/checkpoint.json -- '"hybrid_override_pattern":"M-M*-"' &&
    grep -aoE '"decoder.layers.0.mixer.in_proj.weight":\{[^}]*\}' <<<"$header" | grep -qF '"shape":[168,32]' &&
    grep -aoE '"decoder.layers.2.mixer.conv1d.weight":\{[^}]*\}' <<<"$header" | grep -qF '"shape":[96,1,4]' &&
    grep -aoE '"decoder.layers.2.mixer.norm.weight":\{[^}]*\}' <<<"$header" | grep -qF '"shape":[64]' &&
    grep -aqF '"decoder.layers.0.mixer.D":' <<<"$header" && grep -aqF '"decoder.layers.0.norm.weight":' <<<"$header" &&
    grep -aqF '"decoder.layers.3.self_attention.linear_qkv.weight":' <<<"$header" &&
    grep -aqF '"decoder.layers.1.mlp.linear_fc1.weight":' <<<"$header" &&
    ! grep -aqF '"decoder.layers.3.mlp.' <<<"$header" && ! grep -aqF '"decoder.layers.1.self_attention.' <<<"$header" &&
    pass "the checkpoint records the pattern, the Mamba layers' in_proj [168, 32], conv1d [96, 1, 4], gated norm [64] and D; layer 3 attention only, layer 1 MLP only" ||
    fail "the checkpoint lost the pattern or a layer's tensors"
  if run resume "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt \
       --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    expect_resumed_losses "the resumed run's losses are the straight run's" s.jsonl r.jsonl 4
  fi
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 24 --load ckpt --ckpt-step 20 \
    --save ckpt2 --exit-interval 21 &&
    squeezed_has ckpt2/iter_0000021/checkpoint.json -- '"hybrid_override_pattern":"M-M*-"' &&
    squeezed_has ckpt2/iter_0000021/checkpoint.json -- '"mamba_num_heads":8' &&
    pass "--use-checkpoint-args resumes the hybrid" || fail "--use-checkpoint-args lost the pattern or the Mamba shape"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 --no-kv-cache &&
    { [ -s gen.out ] && cmp -s gen.out gen_full.out && grep -q "KV cache" gen.err &&
        pass "generate decodes the hybrid with the cache (Mamba states carried) as by full forwards" ||
        fail "generate failed on the hybrid, or the cache's text differs from the full forwards'"; }
  if run to_hf "$LATTICE" convert --load ckpt --to-hf hf && run from_hf "$LATTICE" convert --from-hf hf --save back &&
     run gen_back "$LATTICE" generate --load back --prompt "ab" --max-new-tokens 24 --seed 2; then
    squeezed_has hf/config.json -- '"model_type":"nemotron_h"' '"hybrid_override_pattern":"M-M*-"' &&
      cmp -s gen.out gen_back.out && pass "convert writes HuggingFace Nemotron-H and reads it back: the same text" ||
      fail "the Nemotron-H round trip changed the model or its config"
  fi
fi
# MoE layers (E) as Nemotron-3's: the sigmoid router with the expert bias over relu2 experts and a shared expert;
# out to HuggingFace Nemotron-H and back, the same text.
MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-router-score-function sigmoid
     --moe-router-enable-expert-bias --moe-shared-expert-intermediate-size 32 --moe-aux-loss-coeff 0.01)
DENSE=()
for a in "${MODEL[@]}"; do [ "$a" = "M-M*-" ] && DENSE+=("ME*E-") || DENSE+=("$a"); done
if run moe_train "$LATTICE" train "${DENSE[@]}" "${MOE[@]}" "${RUN[@]}" --train-iters 4 --save moe_ckpt &&
   run moe_gen "$LATTICE" generate --load moe_ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
   run moe_to_hf "$LATTICE" convert --load moe_ckpt --to-hf moe_hf &&
   run moe_from_hf "$LATTICE" convert --from-hf moe_hf --save moe_back &&
   run moe_gen_back "$LATTICE" generate --load moe_back --prompt "ab" --max-new-tokens 16 --seed 2; then
  squeezed_has moe_hf/config.json -- '"hybrid_override_pattern":"ME*E-"' '"n_routed_experts":4' &&
    cmp -s moe_gen.out moe_gen_back.out &&
    pass "an MoE hybrid goes to HuggingFace Nemotron-H (Nemotron-3's experts) and back: the same text" ||
    fail "the MoE hybrid's Nemotron-H round trip changed the model or its config"
fi
# Nemotron-3-Super's LatentMoE (--moe-latent-size 16 of hidden 32): trained, decoded, to HuggingFace and back.
if run latent_train "$LATTICE" train "${DENSE[@]}" "${MOE[@]}" --moe-latent-size 16 "${RUN[@]}" --train-iters 4 \
     --save latent_ckpt &&
   run latent_gen "$LATTICE" generate --load latent_ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
   run latent_to_hf "$LATTICE" convert --load latent_ckpt --to-hf latent_hf &&
   run latent_from_hf "$LATTICE" convert --from-hf latent_hf --save latent_back &&
   run latent_gen_back "$LATTICE" generate --load latent_back --prompt "ab" --max-new-tokens 16 --seed 2; then
  squeezed_has latent_ckpt/iter_0000004/checkpoint.json -- '"moe_latent_size":16' &&
    squeezed_has latent_hf/config.json -- '"moe_latent_size":16' &&
    cmp -s latent_gen.out latent_gen_back.out &&
    pass "a LatentMoE hybrid (--moe-latent-size) goes to HuggingFace Nemotron-H and back: the same text" ||
    fail "the LatentMoE hybrid's checkpoint or Nemotron-H round trip lost the latent size or changed the model"
fi
# Under tensor parallelism with sequence parallelism (the experts' ffn split, the projections' gradients summed over
# the pair): one process's losses.
if run latent_tp1 "$LATTICE" train "${DENSE[@]}" "${MOE[@]}" --moe-latent-size 16 "${RUN[@]}" --train-iters 6 \
     --metrics-file lt1.jsonl &&
   run latent_tp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${DENSE[@]}" "${MOE[@]}" --moe-latent-size 16 "${RUN[@]}" --train-iters 6 --tensor-model-parallel-size 2 \
     --sequence-parallel --metrics-file lt2.jsonl; then
  expect_close_losses "LatentMoE under TP 2 with sequence parallelism: the single process's 6 losses" lt2.jsonl lt1.jsonl 6
fi
# LayerNorm has no Nemotron-H form: refused naming it, nothing written.
LN=()
for a in "${MODEL[@]}"; do [ "$a" = RMSNorm ] && LN+=(LayerNorm) || LN+=("$a"); done
if run layernorm "$LATTICE" train "${LN[@]}" "${RUN[@]}" --train-iters 2 --save ln_ckpt; then
  expect_error "convert --to-hf of a LayerNorm hybrid" "LayerNorm (HuggingFace Nemotron-H has RMSNorm)" -- \
    "$LATTICE" convert --load ln_ckpt --to-hf ln_hf
  [ -e ln_hf ] && fail "the refused conversion left ln_hf/ behind"
fi

# Tensor parallelism splits the Mamba heads and groups (with sequence parallelism), pipeline parallelism the
# layers: one process's losses within fp32 rounding.
if run tp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${RUN[@]}" --train-iters 8 --tensor-model-parallel-size 2 --sequence-parallel \
     --metrics-file t2.jsonl &&
   run tp1 "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 8 --metrics-file t1.jsonl; then
  expect_close_losses "TP 2 with sequence parallelism: the single process's 8 losses" t2.jsonl t1.jsonl 8
  # Context parallelism: each rank scans 4 of the 8 heads (1 of the 2 groups) over the whole sequences.
  if run cp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
       "${MODEL[@]}" "${RUN[@]}" --train-iters 8 --context-parallel-size 2 --metrics-file c2.jsonl; then
    expect_close_losses "CP 2 (the heads split, the scan over the whole sequences): the single process's 8 losses" \
      c2.jsonl t1.jsonl 8
  fi
  if run pp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
       "${MODEL[@]}" "${RUN[@]}" --train-iters 8 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 2 \
       --metrics-file p2.jsonl; then
    expect_close_losses "PP 2 (layers M- and M*-): the single process's 8 losses" p2.jsonl t1.jsonl 8
  fi
fi

# Document masks (--reset-attention-mask; the mock data's eod is its last token id): the Mamba layers' state and
# convolution restart at each document, as the attention's mask does; TP 2 gives one process's losses.
DOCS=(--reset-attention-mask --reset-position-ids --eod-mask-loss)
if run docs1 "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" "${DOCS[@]}" --train-iters 8 --metrics-file d1.jsonl &&
   run docs_tp2 env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${RUN[@]}" "${DOCS[@]}" --train-iters 8 --tensor-model-parallel-size 2 --metrics-file d2.jsonl; then
  expect_close_losses "document masks, TP 2: the single process's 8 losses" d2.jsonl d1.jsonl 8
  cmp -s d1.jsonl t1.jsonl && fail "the document masks changed no loss"
fi

# Multi-token prediction depths by Megatron's unified pattern (MAIN/MTP/MTP: two depths of a Mamba layer with an
# MLP block): saved under mtp.layers.<k>.mtp_model_layer.layers.<j>., resumed by --use-checkpoint-args, decoded.
UNI=()
for a in "${MODEL[@]}"; do [ "$a" = "M-M*-" ] && UNI+=("M-M*-/M-/M-") || UNI+=("$a"); done
if run mtp_train "$LATTICE" train "${UNI[@]}" "${RUN[@]}" --train-iters 4 --exit-interval 3 --save mtp_ckpt \
     --metrics-file mtp.jsonl &&
   run mtp_resume "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 4 --load mtp_ckpt --save mtp_ckpt2 &&
   run mtp_gen "$LATTICE" generate --load mtp_ckpt2 --prompt "ab" --max-new-tokens 8 --seed 2; then
  header=$(head -c 65536 mtp_ckpt/iter_0000003/model.safetensors | tr -d '\0')
  squeezed_has mtp_ckpt2/iter_0000004/checkpoint.json -- '"hybrid_override_pattern":"M-M*-/M-/M-"' '"mtp_num_layers":2' &&
    grep -aqF '"mtp.layers.1.mtp_model_layer.layers.0.mixer.in_proj.weight":' <<<"$header" &&
    grep -aqF '"mtp.layers.1.mtp_model_layer.layers.1.mlp.linear_fc1.weight":' <<<"$header" &&
    grep -q '"mtp_losses"' mtp.jsonl &&
    pass "a hybrid with two prediction depths (M-M*-/M-/M-) trains, resumes by --use-checkpoint-args and generates" ||
    fail "the hybrid's prediction depths: names, pattern or resume"
  # Out to HuggingFace Nemotron-H (Nemotron-3's depths: mtp.layers.0..3, num_nextn_predict_layers 2) and back.
  if run mtp_to_hf "$LATTICE" convert --load mtp_ckpt2 --to-hf mtp_hf &&
     run mtp_from_hf "$LATTICE" convert --from-hf mtp_hf --save mtp_back &&
     run mtp_gen_back "$LATTICE" generate --load mtp_back --prompt "ab" --max-new-tokens 8 --seed 2; then
    hf_header=$(head -c 65536 mtp_hf/model.safetensors | tr -d '\0')
    squeezed_has mtp_hf/config.json -- '"num_nextn_predict_layers":2' '"mtp_hybrid_override_pattern":"M-"' &&
      grep -aqF '"mtp.layers.3.final_layernorm.weight":' <<<"$hf_header" &&
      grep -aqF '"mtp.layers.2.eh_proj.weight":' <<<"$hf_header" &&
      squeezed_has mtp_back/iter_0000000/checkpoint.json -- '"hybrid_override_pattern":"M-M*-/M-/M-"' &&
      cmp -s mtp_gen.out mtp_gen_back.out &&
      pass "the prediction depths out to HuggingFace Nemotron-H (flat mtp.layers.<i>) and back: the same text" ||
      fail "the prediction depths' Nemotron-H round trip: names, config or text"
  fi
fi
# --mtp-use-repeated-layer: one depth's parameters for both (no mtp.layers.1 tensor), the flag in the checkpoint.
if run mtp_repeated "$LATTICE" train "${UNI[@]}" "${RUN[@]}" --mtp-use-repeated-layer --train-iters 2 --save rep_ckpt; then
  header=$(head -c 65536 rep_ckpt/iter_0000002/model.safetensors | tr -d '\0')
  squeezed_has rep_ckpt/iter_0000002/checkpoint.json -- '"mtp_use_repeated_layer":true' &&
    grep -aqF '"mtp.layers.0.mtp_model_layer.layers.0.mixer.in_proj.weight":' <<<"$header" &&
    ! grep -aqF '"mtp.layers.1.' <<<"$header" &&
    pass "--mtp-use-repeated-layer: one depth's tensors serve both" ||
    fail "--mtp-use-repeated-layer: the checkpoint holds a second depth or lacks the flag"
  # Out to HuggingFace as NVIDIA publishes Nemotron-3: the shared layer once, num_nextn_predict_layers 1.
  if run rep_to_hf "$LATTICE" convert --load rep_ckpt --to-hf rep_hf &&
     run rep_from_hf "$LATTICE" convert --from-hf rep_hf --save rep_back; then
    squeezed_has rep_hf/config.json -- '"num_nextn_predict_layers":1' &&
      grep -q "written once" rep_to_hf.err &&
      squeezed_has rep_back/iter_0000000/checkpoint.json -- '"hybrid_override_pattern":"M-M*-/M-"' &&
      pass "--mtp-use-repeated-layer: written to HuggingFace once (num_nextn_predict_layers 1), saying so" ||
      fail "--mtp-use-repeated-layer's export: config, note or read-back"
    # The one depth read back trains again as two repeated ones (Megatron's Nemotron-3 recipe on NVIDIA's form).
    if run rep_again "$LATTICE" train "${UNI[@]}" "${RUN[@]}" --mtp-use-repeated-layer --train-iters 2 \
         --load rep_back --finetune --save rep_again_ckpt; then
      squeezed_has rep_again_ckpt/iter_0000002/checkpoint.json -- '"mtp_num_layers":2' '"mtp_use_repeated_layer":true' &&
        pass "the converted one-depth checkpoint fine-tunes as two repeated depths" ||
        fail "the one-depth checkpoint's fine-tune as two repeated depths saved another model"
    fi
    OTHER=()  # the same decoder with depths of an attention and an MLP block
    for a in "${MODEL[@]}"; do [ "$a" = "M-M*-" ] && OTHER+=("M-M*-/*-/*-") || OTHER+=("$a"); done
    expect_error "a one-depth checkpoint under other depth layers" "--hybrid-override-pattern" -- \
      "$LATTICE" train "${OTHER[@]}" "${RUN[@]}" --mtp-use-repeated-layer --train-iters 1 \
      --load rep_back --finetune --save rep_bad
  fi
fi
expect_error "--mtp-num-layers disagreeing with the pattern's depths" "--mtp-num-layers 1 but --hybrid-override-pattern" -- \
  "$LATTICE" train "${UNI[@]}" "${RUN[@]}" --mtp-num-layers 1 --train-iters 1 --save bad7

# Megatron's allocation flags instead of a pattern: 6 layers, a quarter attention and a quarter MLP (1.5 rounds
# to 2 of each, halves to even as Python's round) -> M*-M*-, recorded as the checkpoint's pattern.
ALLOC=(--num-layers 6 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
       --tokenizer-type ByteTokenizer --mamba-head-dim 8 --hybrid-attention-ratio 0.25 --hybrid-mlp-ratio 0.25)
run ratios "$LATTICE" train "${ALLOC[@]}" "${RUN[@]}" --train-iters 1 --save ratio_ckpt &&
  squeezed_has ratio_ckpt/iter_0000001/checkpoint.json -- '"hybrid_override_pattern":"M*-M*-"' &&
  pass "--hybrid-attention-ratio and --hybrid-mlp-ratio allocate Megatron's pattern M*-M*-" ||
  fail "the ratios did not give the pattern M*-M*-"
expect_error "an override pattern with other counts than the ratios'" \
  "--hybrid-override-pattern 'MMM*--' has 3 'M' layers where --hybrid-attention-ratio 0.25" -- "$LATTICE" train \
  "${ALLOC[@]}" --hybrid-override-pattern "MMM*--" "${RUN[@]}" --train-iters 1 --save bad6

SMALL=(--num-layers 3 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
       --tokenizer-type ByteTokenizer --mamba-head-dim 8)
expect_error "a character not in the pattern's alphabet" "'x' at layer 1 is not M (Mamba)" -- "$LATTICE" train \
  "${SMALL[@]}" --hybrid-override-pattern "MxM" "${RUN[@]}" --train-iters 1 --save bad1
expect_error "a pattern longer than --num-layers" "has 4 layers for --num-layers 3" -- "$LATTICE" train \
  "${SMALL[@]}" --hybrid-override-pattern "M*-M" "${RUN[@]}" --train-iters 1 --save bad2
expect_error "E layers without experts" "E layers need --num-experts" -- "$LATTICE" train \
  "${SMALL[@]}" --hybrid-override-pattern "ME*" "${RUN[@]}" --train-iters 1 --save bad3
expect_error "groups not dividing the heads" "--mamba-num-groups 3 does not divide the Mamba heads 8" -- \
  "$LATTICE" train "${SMALL[@]}" --hybrid-override-pattern "M*-" --mamba-num-groups 3 "${RUN[@]}" --train-iters 1 \
  --save bad4
# Under mpirun every rank prints the same line (and mpirun its banner).
if env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train "${SMALL[@]}" \
     --hybrid-override-pattern "M*-" --mamba-num-groups 1 "${RUN[@]}" --train-iters 1 --context-parallel-size 2 \
     --save bad5 >cp.out 2>cp.err; then
  fail "a context-parallel group not dividing the Mamba groups was not refused"
else
  grep "lattice train: error:" cp.err | sort -u >cp.lines
  [ "$(wc -l <cp.lines)" = 1 ] &&
    grep -q -- "--context-parallel-size 2 does not divide the Mamba heads (8) and groups (--mamba-num-groups 1)" cp.lines &&
    ! grep -q "iteration" cp.out && pass "a CP size not dividing the Mamba groups: $(cat cp.lines)" ||
    fail "a CP size not dividing the Mamba groups: $(cat cp.err)"
fi
[ -e bad1 ] || [ -e bad2 ] || [ -e bad3 ] || [ -e bad4 ] || [ -e bad5 ] || [ -e bad6 ] || [ -e bad7 ] && fail "a refused run left a checkpoint behind"
e2e_finish
