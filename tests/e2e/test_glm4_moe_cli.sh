#!/usr/bin/env bash
# GLM-4.5 from the command line: a model with GLM-4.5's settings (grouped-query attention with q/k/v biases
# and q/k norms, half of each head rotated, DeepSeek-V3's sigmoid-routed experts with the expert bias and a
# shared expert, the first layer dense, a prediction depth) trains, goes out to HuggingFace GLM-4.5 (the
# depth its multi-token prediction layer) and back generating the same text; the independent HuggingFace
# fixtures convert in and train on; a sigmoid-routed model with no HuggingFace form is a one-line error
# with nothing written.
#   bash tests/e2e/test_glm4_moe_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

GLM=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
     --kv-channels 16 --seq-length 32 --max-position-embeddings 32 --tokenizer-type ByteTokenizer
     --normalization RMSNorm --swiglu --disable-bias-linear --add-qkv-bias --qk-layernorm
     --position-embedding-type rope --rotary-percent 0.5 --rotary-base 1000000 --num-experts 8 --moe-router-topk 4
     --moe-ffn-hidden-size 16 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
     --moe-router-topk-scaling-factor 2.5 --moe-shared-expert-intermediate-size 16 --moe-layer-freq '[0,1]'
     --moe-aux-loss-coeff 0.001 --mtp-num-layers 1)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

if run train "$LATTICE" train "${GLM[@]}" "${RUN[@]}" --train-iters 3 --save ckpt &&
   run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
   run to_hf "$LATTICE" convert --load ckpt --to-hf hf-glm; then
  grep -q '"model_type": "glm4_moe"' hf-glm/config.json && grep -q '"attention_bias": true' hf-glm/config.json &&
    grep -q '"use_qk_norm": true' hf-glm/config.json && grep -q '"partial_rotary_factor": 0.5' hf-glm/config.json &&
    grep -q '"first_k_dense_replace": 1' hf-glm/config.json && grep -q '"routed_scaling_factor": 2.5' hf-glm/config.json &&
    grep -q '"num_nextn_predict_layers": 1' hf-glm/config.json &&
    pass "the export is HuggingFace GLM-4.5: $(tail -n 1 to_hf.err)" || fail "the export is not GLM-4.5's form"
  run from_hf "$LATTICE" convert --from-hf hf-glm --save back &&
    grep -q '"mtp_num_layers": *1' back/iter_0000000/*.json &&
    run gen_back "$LATTICE" generate --load back --prompt "ab" --max-new-tokens 16 --seed 2 &&
    { cmp -s gen.out gen_back.out && pass "lattice -> HF GLM-4.5 -> lattice generates the same text" ||
        fail "the model generates other text after the GLM-4.5 round trip"; }
fi
for f in hf_glm4_moe_tiny hf_glm4_moe_air_tiny; do
  run "$f" "$LATTICE" convert --from-hf "$SRC/tests/fixtures/$f" --save "ckpt-$f" &&
    grep -q '"moe_router_score_function": *"sigmoid"' "ckpt-$f"/iter_0000000/*.json &&
    grep -q "(GLM-4.5)" "$f.err" && pass "$f converts: $(tail -n 1 "$f.err")" || fail "$f did not convert"
done
# The converted model trains on (--use-checkpoint-args: its attention, experts and prediction depth).
run finetune "$LATTICE" train --use-checkpoint-args --load ckpt-hf_glm4_moe_tiny --vocab-size 101 \
  --micro-batch-size 2 --global-batch-size 4 --seq-length 16 --lr 1e-3 --log-interval 1 --mock-data --eval-iters 0 \
  --train-iters 3 --finetune --save ft && grep -q 'mtp_1 loss' finetune.out &&
  pass "the converted GLM-4.5 trains on with its prediction depth" || fail "the converted GLM-4.5 did not train"
# GLM-4.7-Flash (glm4_moe_lite: DeepSeek-V3's multi-latent attention with GLM's config): in, trained on, and out
# in its own form (the recorded model_type), its latents' epsilon kept.
if run lite "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_glm4_moe_lite_tiny" --save ckpt-lite &&
   grep -q "(GLM-4.7-Flash)" lite.err && grep -qE '"mla_latent_norm_epsilon": *(1e-0*6|9\.99999)' ckpt-lite/iter_0000000/*.json; then
  pass "GLM-4.7-Flash converts with its latents' epsilon: $(tail -n 1 lite.err)"
  run lite_ft "$LATTICE" train --use-checkpoint-args --load ckpt-lite --vocab-size 101 --micro-batch-size 2 \
    --global-batch-size 4 --seq-length 16 --lr 1e-3 --log-interval 1 --mock-data --eval-iters 0 --train-iters 2 \
    --finetune --save lite-ft && grep -q 'mtp_1 loss' lite_ft.out &&
    grep -qE '"mla_latent_norm_epsilon": *(1e-0*6|9\.99999)' lite-ft/iter_0000002/*.json &&
    run lite_out "$LATTICE" convert --load lite-ft --to-hf hf-lite && grep -q '"model_type": "glm4_moe_lite"' hf-lite/config.json &&
    grep -q '"mlp_layer_types"' hf-lite/config.json && grep -q "GLM-4.7-Flash" lite_out.err &&
    pass "the converted GLM-4.7-Flash trains on and goes back out as glm4_moe_lite" ||
    fail "GLM-4.7-Flash did not train on and go back out in its form"
else
  fail "GLM-4.7-Flash did not convert with its latents' epsilon"
fi
# Sigmoid-routed experts with LayerNorm: no HuggingFace family has that.
if run ln_train "$LATTICE" train "${GLM[@]/RMSNorm/LayerNorm}" "${RUN[@]}" --train-iters 1 --save lnckpt; then
  expect_error "a sigmoid-routed LayerNorm model" "neither HuggingFace GPT-2, Llama, GPT-OSS, GLM-4.5 nor StarCoder2" -- \
    "$LATTICE" convert --load lnckpt --to-hf hf-ln
  [ -e hf-ln ] && fail "the refused export left a directory behind"
fi
e2e_finish
