#!/usr/bin/env bash
# Multi-latent attention from the command line (--multi-latent-attention, --q-lora-rank, --kv-lora-rank,
# --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim): a model trains, saves Megatron's MLA weights and its
# shapes, resumes from its checkpoint to the straight run's losses and by --use-checkpoint-args, generates
# the same text with and without the KV cache; the HuggingFace export and bad combinations are one-line
# errors naming the flag, with nothing written.
#   bash tests/e2e/test_mla_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --tokenizer-type ByteTokenizer --normalization RMSNorm --disable-bias-linear)
MODEL=("${BASE[@]}" --position-embedding-type rope)
SHAPES=(--q-lora-rank 16 --qk-head-dim 8 --v-head-dim 6)
MLA=(--multi-latent-attention "${SHAPES[@]}" --kv-lora-rank 12 --qk-pos-emb-head-dim 4 --qk-layernorm)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "a multi-latent attention model trains: lm loss $first -> $last" || fail "the loss did not fall: $first -> $last"
  meta=$(cat ckpt/iter_0000020/*.json)
  grep -q '"multi_latent_attention": *true' <<< "$meta" && grep -q '"q_lora_rank": *16' <<< "$meta" &&
    grep -q '"v_head_dim": *6' <<< "$meta" &&
    grep -qF 'decoder.layers.1.self_attention.linear_kv_down_proj.weight' <<< "$meta" &&
    grep -qF 'decoder.layers.0.self_attention.kv_layernorm.weight' <<< "$meta" &&
    grep -qF 'decoder.layers.0.self_attention.linear_q_up_proj.weight' <<< "$meta" &&
    ! grep -qF 'linear_qkv' <<< "$meta" &&
    pass "the checkpoint records the MLA shapes and Megatron's MLA weights (no linear_qkv)" ||
    fail "the checkpoint lost the multi-latent attention"
  if run resume "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt \
       --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    want=$(tail -n 4 s.jsonl | grep -o '"lm_loss":[^,}]*')
    got=$(grep -o '"lm_loss":[^,}]*' r.jsonl)
    [ -n "$want" ] && [ "$got" = "$want" ] && pass "the resumed run's losses are the straight run's" ||
      fail "the resumed run differs from the straight one"
  fi
  expect_error "resume without --multi-latent-attention" "multi_latent_attention|--multi-latent-attention" -- \
    "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt3
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 24 --load ckpt --ckpt-step 20 \
    --save ckpt2 --exit-interval 21 && grep -q '"kv_lora_rank": *12' ckpt2/iter_0000021/*.json &&
    pass "--use-checkpoint-args resumes the multi-latent attention" || fail "--use-checkpoint-args lost the MLA shapes"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 16 --seed 2 --no-kv-cache &&
    { cmp -s gen.out gen_full.out && pass "generate gives the same text with and without the KV cache" ||
        fail "generate differs with and without the KV cache"; }
fi

# DeepSeek-V3-style (MLA, sigmoid routing with the expert bias in 2 of 4 groups, ungated shared experts, the first
# layer dense, the norms' epsilon 1e-6, a prediction depth): out to HuggingFace DeepSeek-V3 (the depth its
# multi-token prediction module) and back, the same text; the independent HuggingFace fixtures in.
DS3=("${MODEL[@]}" "${MLA[@]}" --swiglu --norm-epsilon 1e-6 --num-experts 8 --moe-router-topk 4 --moe-ffn-hidden-size 16
     --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 4
     --moe-router-group-topk 2 --moe-router-topk-scaling-factor 2.5 --moe-shared-expert-intermediate-size 16
     --moe-layer-freq '[0,1]' --moe-aux-loss-coeff 0.001 --mtp-num-layers 1)
if run ds3_train "$LATTICE" train "${DS3[@]}" "${RUN[@]}" --train-iters 3 --save ds3ckpt &&
   run ds3_gen "$LATTICE" generate --load ds3ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
   run ds3_to_hf "$LATTICE" convert --load ds3ckpt --to-hf hf-ds3; then
  grep -q '"model_type": "deepseek_v3"' hf-ds3/config.json && grep -q '"kv_lora_rank": 12' hf-ds3/config.json &&
    grep -q '"first_k_dense_replace": 1' hf-ds3/config.json && grep -q '"topk_group": 2' hf-ds3/config.json &&
    grep -q '"num_nextn_predict_layers": 1' hf-ds3/config.json &&
    run ds3_from_hf "$LATTICE" convert --from-hf hf-ds3 --save ds3back &&
    grep -q '"mtp_num_layers": *1' ds3back/iter_0000000/*.json &&
    run ds3_gen_back "$LATTICE" generate --load ds3back --prompt "ab" --max-new-tokens 16 --seed 2 &&
    { cmp -s ds3_gen.out ds3_gen_back.out && pass "lattice -> HF DeepSeek-V3 -> lattice generates the same text" ||
        fail "the model generates other text after the DeepSeek-V3 round trip"; }
fi
# DeepSeek-V2-style (the softmax router, unnormalized and scaled, every expert kept): out to HuggingFace DeepSeek-V2 and back.
DS2=("${MODEL[@]}" --multi-latent-attention --kv-lora-rank 12 --qk-head-dim 8 --qk-pos-emb-head-dim 4 --v-head-dim 6
     --qk-layernorm --swiglu --norm-epsilon 1e-6 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 16
     --moe-router-pre-softmax --moe-router-topk-scaling-factor 1.5 --moe-shared-expert-intermediate-size 32
     --moe-layer-freq '[0,1]' --moe-aux-loss-coeff 0.001)
if run ds2_train "$LATTICE" train "${DS2[@]}" "${RUN[@]}" --train-iters 3 --save ds2ckpt &&
   run ds2_gen "$LATTICE" generate --load ds2ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
   run ds2_to_hf "$LATTICE" convert --load ds2ckpt --to-hf hf-ds2; then
  grep -q '"model_type": "deepseek_v2"' hf-ds2/config.json && grep -q '"q_lora_rank": null' hf-ds2/config.json &&
    grep -q '"norm_topk_prob": false' hf-ds2/config.json &&
    run ds2_from_hf "$LATTICE" convert --from-hf hf-ds2 --save ds2back &&
    run ds2_gen_back "$LATTICE" generate --load ds2back --prompt "ab" --max-new-tokens 16 --seed 2 &&
    { cmp -s ds2_gen.out ds2_gen_back.out && pass "lattice -> HF DeepSeek-V2 -> lattice generates the same text" ||
        fail "the model generates other text after the DeepSeek-V2 round trip"; }
fi
expect_error "an MLA model without DeepSeek-V3's form" "the checkpoint's model has the latents' norms at epsilon 1e-05|--mla-latent-norm-epsilon 1e-6" -- \
  "$LATTICE" convert --load ckpt --to-hf hf-dense
[ -e hf-dense ] && fail "the refused export left a directory behind"
for f in hf_deepseek_v3_tiny hf_deepseek_v3_tiny_noq hf_deepseek_v2_lite_tiny hf_deepseek_v3_tiny_mtp; do
  run "$f" "$LATTICE" convert --from-hf "$SRC/tests/fixtures/$f" --save "ckpt-$f" &&
    grep -q '"multi_latent_attention": *true' "ckpt-$f"/iter_0000000/*.json &&
    pass "$f converts: $(tail -n 1 "$f.err")" || fail "$f did not convert"
done
# Kimi-K2: DeepSeek-V3 under model_type kimi_k2, read as DeepSeek-V3 and written back as kimi_k2.
mkdir -p hf-kimi && cp "$SRC/tests/fixtures/hf_deepseek_v3_tiny/model.safetensors" hf-kimi/ &&
  sed 's/"model_type": "deepseek_v3"/"model_type": "kimi_k2"/' "$SRC/tests/fixtures/hf_deepseek_v3_tiny/config.json" \
    > hf-kimi/config.json
if run kimi_in "$LATTICE" convert --from-hf hf-kimi --save ckpt-kimi && grep -q "(Kimi-K2)" kimi_in.err &&
   run kimi_out "$LATTICE" convert --load ckpt-kimi --to-hf hf-kimi-out; then
  grep -q '"model_type": "kimi_k2"' hf-kimi-out/config.json && grep -q "Kimi-K2" kimi_out.err &&
    pass "Kimi-K2 converts in and back out as kimi_k2" || fail "Kimi-K2 did not go back out as kimi_k2"
fi
expect_error "--hf-model-type kimi_k2 on a DeepSeek-V2 model" "--hf-model-type kimi_k2|deepseek_v2" -- \
  "$LATTICE" convert --load ckpt-hf_deepseek_v2_lite_tiny --to-hf hf-v2-kimi --hf-model-type kimi_k2
[ -e hf-v2-kimi ] && fail "the refused export left a directory behind"
grep -q '"mtp_num_layers": *1' ckpt-hf_deepseek_v3_tiny_mtp/iter_0000000/*.json &&
  pass "DeepSeek-V3's multi-token prediction module is a prediction depth" || fail "the MTP module was not read"
# The converted model trains on (--use-checkpoint-args: its MLA, experts and prediction depth).
run ds3_finetune "$LATTICE" train --use-checkpoint-args --load ckpt-hf_deepseek_v3_tiny_mtp --vocab-size 101 \
  --micro-batch-size 2 --global-batch-size 4 --seq-length 16 --lr 1e-3 --log-interval 1 --mock-data --eval-iters 0 \
  --train-iters 3 --finetune --save ds3ft && grep -q 'mtp_1 loss' ds3_finetune.out &&
  pass "the converted DeepSeek-V3 trains on with its prediction depth" || fail "the converted DeepSeek-V3 did not train"

# --recompute-modules mla_up_proj: the fused qkv rebuilt from the kept latents in backward, the same losses bit for bit.
if run plain "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" "${RUN[@]}" --train-iters 4 --metrics-file p.jsonl &&
   run up_proj "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" "${RUN[@]}" --train-iters 4 --metrics-file u.jsonl \
     --recompute-granularity selective --recompute-modules core_attn mla_up_proj; then
  [ -n "$(field p.jsonl lm_loss)" ] && [ "$(field p.jsonl lm_loss)" = "$(field u.jsonl lm_loss)" ] &&
    pass "--recompute-modules mla_up_proj trains to the same losses bit for bit" ||
    fail "--recompute-modules mla_up_proj changed the losses"
fi
# Megatron's MLA spellings of the rotary options: --rope-type yarn with --rotary-scaling-factor, --mscale-all-dim.
if run megatron_rope "$LATTICE" train "${BASE[@]}" "${MLA[@]}" "${RUN[@]}" --rope-type yarn --rotary-scaling-factor 4 \
     --mscale-all-dim 1 --train-iters 2 --save yarn_ckpt; then
  meta=$(cat yarn_ckpt/iter_0000002/*.json)
  grep -q '"position_embedding_type": *"yarn"' <<< "$meta" && grep -q '"yarn_rotary_scaling_factor": *4' <<< "$meta" &&
    grep -q '"yarn_mscale_all_dim": *1' <<< "$meta" &&
    pass "--rope-type yarn --rotary-scaling-factor 4 --mscale-all-dim 1 set YaRN's options" ||
    fail "Megatron's MLA rotary spellings did not reach the model"
fi
expect_error "rope type" "--rope-type yarn contradicts --position-embedding-type rope" -- \
  "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" --rope-type yarn "${RUN[@]}" --train-iters 1 --save bad6
expect_error "learned positions" "--multi-latent-attention needs --position-embedding-type rope or yarn" -- \
  "$LATTICE" train "${BASE[@]}" "${MLA[@]}" "${RUN[@]}" --train-iters 1 --save bad1
expect_error "grouped-query attention" "--num-query-groups 2 does not go with --multi-latent-attention" -- \
  "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" --group-query-attention --num-query-groups 2 "${RUN[@]}" --train-iters 1 \
  --save bad2
expect_error "odd rotary dims" "--qk-pos-emb-head-dim 3 must be even" -- \
  "$LATTICE" train "${MODEL[@]}" --multi-latent-attention "${SHAPES[@]}" --qk-pos-emb-head-dim 3 "${RUN[@]}" \
  --train-iters 1 --save bad3
expect_error "rotary percent" "--rotary-percent (MLA rotates the Dr dims) does not go with --multi-latent-attention" -- \
  "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" --rotary-percent 0.5 "${RUN[@]}" --train-iters 1 --save bad4
expect_error "empty latent" "--kv-lora-rank must be >= 1 with --multi-latent-attention, got 0" -- \
  "$LATTICE" train "${MODEL[@]}" --multi-latent-attention "${SHAPES[@]}" --kv-lora-rank 0 "${RUN[@]}" \
  --train-iters 1 --save bad5
expect_error "latent epsilon without latent norms" "--mla-latent-norm-epsilon needs --qk-layernorm" -- \
  "$LATTICE" train "${MODEL[@]}" --multi-latent-attention "${SHAPES[@]}" --mla-latent-norm-epsilon 1e-6 "${RUN[@]}" \
  --train-iters 1 --save bad6
expect_error "latent epsilon without MLA" "--mla-latent-norm-epsilon needs --multi-latent-attention" -- \
  "$LATTICE" train "${MODEL[@]}" --mla-latent-norm-epsilon 1e-6 "${RUN[@]}" --train-iters 1 --save bad6
expect_error "negative latent epsilon" "--mla-latent-norm-epsilon must be a finite number >= 0" -- \
  "$LATTICE" train "${MODEL[@]}" "${MLA[@]}" --mla-latent-norm-epsilon -1e-6 "${RUN[@]}" --train-iters 1 --save bad6
[ -e bad1 ] || [ -e bad2 ] || [ -e bad3 ] || [ -e bad4 ] || [ -e bad5 ] || [ -e bad6 ] || [ -e ckpt3 ] &&
  fail "a refused run left a checkpoint behind"
e2e_finish
