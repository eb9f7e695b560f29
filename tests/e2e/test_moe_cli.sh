#!/usr/bin/env bash
# Mixture of experts from the command line (--num-experts, --moe-router-topk, --moe-ffn-hidden-size,
# --moe-aux-loss-coeff): a model trains and its loss falls; the checkpoint records the experts and a
# resume without them is a one-line error naming the flag; --use-checkpoint-args resumes it;
# generate prints the same text with and without the KV cache; bad combinations are one-line
# errors naming the flag, with nothing written; the model goes to HuggingFace Mixtral (Qwen3-MoE with
# --qk-layernorm) and back generating the same text, and the independent fixtures come in. A
# Qwen2-MoE-style model (--add-qkv-bias, gated shared experts, pre-softmax gates, a dense first
# layer by --moe-layer-freq) trains, resumes by --use-checkpoint-args, and goes to HuggingFace
# Qwen2-MoE and back generating the same text, a DeepSeek-MoE-style one to DeepSeek-MoE and back.
# Sinkhorn routing trains and generates; sigmoid scores with the expert bias (aux-loss-free)
# train, keep the bias in the checkpoint, resume and generate; HuggingFace export refuses them.
#   bash tests/e2e/test_moe_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --position-embedding-type rope --normalization RMSNorm --swiglu --tokenizer-type ByteTokenizer)
DENSE=("${BASE[@]}" --disable-bias-linear)
EXPERTS=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48)
MOE=("${DENSE[@]}" "${EXPERTS[@]}" --moe-aux-loss-coeff 0.01)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

losses() { grep -o '"lm_loss":[^,}]*' "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MOE[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl; then
  first=$(losses m.jsonl | head -n 1)
  last=$(losses m.jsonl | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "a 4-expert model trains: lm loss $first -> $last" || fail "the MoE model's loss did not fall: $first -> $last"
  # Megatron's log: the load-balancing loss over its coefficient after the lm loss (1: evenly loaded).
  lb=$(grep -o '"load_balancing_loss":[^,}]*' m.jsonl | tail -n 1 | cut -d: -f2)
  grep -q 'lm loss: [^|]*| load_balancing_loss: [0-9.E+-]* |' train.out && [ -n "$lb" ] &&
    awk -v v="$lb" 'BEGIN { exit !(v >= 0.5 && v <= 4) }' &&
    pass "the log and the metrics carry the load-balancing loss ($lb)" || fail "no load-balancing loss logged ($lb)"
  grep -q '"num_experts": *4' ckpt/iter_0000020/*.json && grep -qF 'mlp.experts.local_experts.3.linear_fc2.weight' \
    ckpt/iter_0000020/*.json && pass "the checkpoint records 4 experts and their weights" ||
    fail "the checkpoint lost the experts"
  expect_error "resume without --num-experts" "num_experts|--num-experts" -- \
    "$LATTICE" train "${DENSE[@]}" "${RUN[@]}" --train-iters 24 --load ckpt
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --moe-aux-loss-coeff 0.01 --train-iters 24 \
    --load ckpt --save ckpt2 && grep -q '"num_experts": *4' ckpt2/iter_0000024/*.json &&
    pass "--use-checkpoint-args resumes the MoE model"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 24 --seed 2 --no-kv-cache &&
    { cmp -s gen.out gen_full.out && pass "generate with the KV cache prints what full recomputation prints" ||
        fail "generate differs with and without the KV cache"; }
  # Its HuggingFace form is Mixtral: out and back, the same text.
  if run to_hf "$LATTICE" convert --load ckpt --to-hf hf-mixtral; then
    grep -q '"model_type": "mixtral"' hf-mixtral/config.json && grep -q '"num_local_experts": 4' hf-mixtral/config.json &&
      pass "convert --to-hf wrote a Mixtral config with 4 experts" || fail "convert --to-hf of a MoE model wrote no Mixtral config"
    run from_hf "$LATTICE" convert --from-hf hf-mixtral --save ckpt-back &&
      run gen_back "$LATTICE" generate --load ckpt-back --prompt "ab" --max-new-tokens 24 --seed 2 &&
      { cmp -s gen.out gen_back.out && pass "lattice -> HF Mixtral -> lattice generates the same text" ||
          fail "the model generates other text after the Mixtral round trip"; }
  fi
fi
QWEN2MOE=("${MOE[@]}" --add-qkv-bias --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate
          --moe-router-pre-softmax --moe-layer-freq '([0]*1+[1]*1)')
if run q2_train "$LATTICE" train "${QWEN2MOE[@]}" "${RUN[@]}" --train-iters 6 --exit-interval 4 --save q2ckpt; then
  grep -qF 'mlp.shared_experts.gate_weight' q2ckpt/iter_0000004/*.json &&
    ! grep -qF 'decoder.layers.0.mlp.router.weight' q2ckpt/iter_0000004/*.json &&
    grep -qF 'decoder.layers.0.mlp.linear_fc1.weight' q2ckpt/iter_0000004/*.json &&
    pass "a Qwen2-MoE-style checkpoint: gated shared experts, layer 0 dense" || fail "the Qwen2-MoE-style checkpoint's tensors"
  run q2_resume "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --moe-aux-loss-coeff 0.01 --train-iters 6 \
    --load q2ckpt --save q2ckpt && pass "--use-checkpoint-args resumes the shared experts and the layer pattern"
  run q2_gen "$LATTICE" generate --load q2ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
    run q2_to_hf "$LATTICE" convert --load q2ckpt --to-hf hf-q2 &&
    grep -q '"model_type": "qwen2_moe"' hf-q2/config.json && grep -q '"norm_topk_prob": false' hf-q2/config.json &&
    run q2_from_hf "$LATTICE" convert --from-hf hf-q2 --save q2back &&
    run q2_gen_back "$LATTICE" generate --load q2back --prompt "ab" --max-new-tokens 16 --seed 2 &&
    { cmp -s q2_gen.out q2_gen_back.out && pass "lattice -> HF Qwen2-MoE -> lattice generates the same text" ||
        fail "the model generates other text after the Qwen2-MoE round trip"; }
fi
# DeepSeek-MoE-style (ungated shared experts of 2 x 48, the first layer dense, pre-softmax gates):
# out to HuggingFace DeepSeek-MoE and back, the same text.
DSMOE=("${MOE[@]}" --moe-shared-expert-intermediate-size 96 --moe-router-pre-softmax --moe-layer-freq '[0,1]')
if run ds_train "$LATTICE" train "${DSMOE[@]}" "${RUN[@]}" --train-iters 3 --save dsckpt &&
   run ds_gen "$LATTICE" generate --load dsckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
   run ds_to_hf "$LATTICE" convert --load dsckpt --to-hf hf-ds; then
  grep -q '"model_type": "deepseek"' hf-ds/config.json && grep -q '"n_shared_experts": 2' hf-ds/config.json &&
    grep -q '"first_k_dense_replace": 1' hf-ds/config.json &&
    run ds_from_hf "$LATTICE" convert --from-hf hf-ds --save dsback &&
    run ds_gen_back "$LATTICE" generate --load dsback --prompt "ab" --max-new-tokens 16 --seed 2 &&
    { cmp -s ds_gen.out ds_gen_back.out && pass "lattice -> HF DeepSeek-MoE -> lattice generates the same text" ||
        fail "the model generates other text after the DeepSeek-MoE round trip"; }
fi
SIG=("${MOE[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01)
if run sig_train "$LATTICE" train "${SIG[@]}" "${RUN[@]}" --train-iters 6 --exit-interval 4 --save sigckpt; then
  grep -qF 'decoder.layers.1.mlp.router.expert_bias' sigckpt/iter_0000004/*.json &&
    grep -q '"moe_router_score_function": *"sigmoid"' sigckpt/iter_0000004/*.json &&
    pass "sigmoid scores: the checkpoint records the expert bias" || fail "the checkpoint lost the expert bias"
  run sig_resume "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --moe-aux-loss-coeff 0.01 --train-iters 6 \
    --load sigckpt --save sigckpt && pass "--use-checkpoint-args resumes the sigmoid router and its bias"
  run sig_gen "$LATTICE" generate --load sigckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
    run sig_gen_full "$LATTICE" generate --load sigckpt --prompt "ab" --max-new-tokens 16 --seed 2 --no-kv-cache &&
    { cmp -s sig_gen.out sig_gen_full.out && pass "the sigmoid router generates the same with and without the KV cache" ||
        fail "the sigmoid router generates differently with the KV cache"; }
  expect_error "HuggingFace export of sigmoid scores" "sigmoid" -- "$LATTICE" convert --load sigckpt --to-hf hf-sig
  [ -e hf-sig/model.safetensors ] && fail "a refused export wrote a model"
fi
# --moe-apply-probs-on-input (top-1 gates, the softmax over every expert, on the experts' input): trains, the
# checkpoint says so, --use-checkpoint-args resumes it, the KV cache generates as full recomputation,
# HF export refused; without top-1 refused.
PIN=("${DENSE[@]}" --num-experts 4 --moe-router-topk 1 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 0.01
     --moe-router-pre-softmax --moe-apply-probs-on-input)
if run pin_train "$LATTICE" train "${PIN[@]}" "${RUN[@]}" --train-iters 4 --exit-interval 2 --save pinckpt; then
  grep -q '"moe_apply_probs_on_input": *true' pinckpt/iter_0000002/*.json &&
    pass "--moe-apply-probs-on-input: the checkpoint records it" || fail "the checkpoint lost --moe-apply-probs-on-input"
  run pin_resume "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --moe-aux-loss-coeff 0.01 --train-iters 4 \
    --load pinckpt --save pinckpt && grep -q "iteration        4/" pin_resume.out &&
    pass "--use-checkpoint-args resumes --moe-apply-probs-on-input"
  run pin_gen "$LATTICE" generate --load pinckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
    run pin_gen_full "$LATTICE" generate --load pinckpt --prompt "ab" --max-new-tokens 16 --seed 2 --no-kv-cache &&
    { cmp -s pin_gen.out pin_gen_full.out && pass "--moe-apply-probs-on-input generates the same with and without the KV cache" ||
        fail "--moe-apply-probs-on-input generates differently with the KV cache"; }
  expect_error "HuggingFace export of probabilities on the input" "--moe-apply-probs-on-input" -- \
    "$LATTICE" convert --load pinckpt --to-hf hf-pin
  [ -e hf-pin/model.safetensors ] && fail "a refused export wrote a model"
fi
expect_error "probabilities on the input with top-2" "--moe-apply-probs-on-input needs --moe-router-topk 1, got 2" -- \
  "$LATTICE" train "${MOE[@]}" --moe-apply-probs-on-input "${RUN[@]}" --train-iters 1 --save bad14
# --moe-input-jitter-eps: training forwards route on noisy input (the first loss moves; the same seed, the
# same run), evaluation does not (--skip-train on the checkpoint: the same validation and test losses with
# and without the flag); out of range or without experts refused in one line.
JIT=(--moe-input-jitter-eps 0.2)
EVALS=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 2
       --eval-interval 100)  # RUN with evaluations
if run jit_a "$LATTICE" train "${MOE[@]}" "${JIT[@]}" "${EVALS[@]}" --train-iters 3 --save jitckpt \
     --metrics-file jit_a.jsonl &&
   run jit_b "$LATTICE" train "${MOE[@]}" "${JIT[@]}" "${EVALS[@]}" --train-iters 3 --metrics-file jit_b.jsonl &&
   run jit_none "$LATTICE" train "${MOE[@]}" "${EVALS[@]}" --train-iters 3 --metrics-file jit_none.jsonl; then
  [ "$(losses jit_a.jsonl | tr '\n' ' ')" = "$(losses jit_b.jsonl | tr '\n' ' ')" ] &&
    pass "--moe-input-jitter-eps: the same seed gives the same losses" || fail "--moe-input-jitter-eps: two runs differ"
  a1=$(losses jit_a.jsonl | head -n 1)
  n1=$(losses jit_none.jsonl | head -n 1)
  [ -n "$a1" ] && [ "$a1" != "$n1" ] && pass "--moe-input-jitter-eps moves the first loss ($n1 -> $a1)" ||
    fail "--moe-input-jitter-eps did not change the first loss ($n1, $a1)"
  if run jit_eval "$LATTICE" train "${MOE[@]}" "${JIT[@]}" "${EVALS[@]}" --train-iters 3 --load jitckpt \
       --skip-train --metrics-file jit_eval.jsonl &&
     run jit_eval_none "$LATTICE" train "${MOE[@]}" "${EVALS[@]}" --train-iters 3 --load jitckpt \
       --skip-train --metrics-file jit_eval_none.jsonl; then
    got=$(grep -o '"\(val\|test\)_loss":[^,}]*' jit_eval.jsonl | tr '\n' ' ')
    want=$(grep -o '"\(val\|test\)_loss":[^,}]*' jit_eval_none.jsonl | tr '\n' ' ')
    [ -n "$want" ] && [ "$got" = "$want" ] && pass "--moe-input-jitter-eps leaves evaluation alone: $got" ||
      fail "evaluation with --moe-input-jitter-eps '$got', without '$want'"
  fi
fi
expect_error "jitter out of range" "--moe-input-jitter-eps must be in [0, 1)" -- \
  "$LATTICE" train "${MOE[@]}" --moe-input-jitter-eps 1.5 "${RUN[@]}" --train-iters 1 --save bad15
expect_error "jitter without experts" "--moe-input-jitter-eps is the MoE router's: it needs --num-experts" -- \
  "$LATTICE" train "${DENSE[@]}" --moe-input-jitter-eps 0.1 "${RUN[@]}" --train-iters 1 --save bad16
# --moe-router-force-load-balancing (benchmarks): routing by random logits; the same seed, the same run; the
# first loss moves; without experts refused.
if run fb_a "$LATTICE" train "${MOE[@]}" --moe-router-force-load-balancing "${EVALS[@]}" --train-iters 3 \
     --metrics-file fb_a.jsonl &&
   run fb_b "$LATTICE" train "${MOE[@]}" --moe-router-force-load-balancing "${EVALS[@]}" --train-iters 3 \
     --metrics-file fb_b.jsonl; then
  [ "$(losses fb_a.jsonl | tr '\n' ' ')" = "$(losses fb_b.jsonl | tr '\n' ' ')" ] &&
    pass "--moe-router-force-load-balancing: the same seed gives the same losses" ||
    fail "--moe-router-force-load-balancing: two runs differ"
  f1=$(losses fb_a.jsonl | head -n 1)
  [ -n "$f1" ] && [ -n "${n1:-}" ] && [ "$f1" != "$n1" ] &&
    pass "--moe-router-force-load-balancing routes otherwise: first loss $n1 -> $f1" ||
    fail "--moe-router-force-load-balancing did not change the first loss (${n1:-none}, $f1)"
  grep -q '"val_loss"' fb_a.jsonl && pass "--moe-router-force-load-balancing evaluates" ||
    fail "--moe-router-force-load-balancing: no validation loss"
fi
expect_error "forced balance without experts" "--moe-router-force-load-balancing is the MoE router's" -- \
  "$LATTICE" train "${DENSE[@]}" --moe-router-force-load-balancing "${RUN[@]}" --train-iters 1 --save bad17
# bf16 with the router in fp32.
run bf16_router "$LATTICE" train "${MOE[@]}" --bf16 --moe-router-dtype fp32 "${RUN[@]}" --train-iters 2 &&
  pass "--bf16 --moe-router-dtype fp32 trains"
# A capacity: tokens over an expert's capacity dropped in training; the run trains and generates.
run cap_train "$LATTICE" train "${MOE[@]}" --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position "${RUN[@]}" \
  --train-iters 3 --save capckpt --metrics-file cap.jsonl &&
  pass "--moe-expert-capacity-factor 1.0 --moe-token-drop-policy position trains"
# Padding each expert's rows to its capacity (gate-0 tokens, Megatron's) changes no number.
run cap_pad "$LATTICE" train "${MOE[@]}" --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position "${RUN[@]}" \
  --train-iters 3 --moe-pad-expert-input-to-capacity --metrics-file cap_pad.jsonl &&
  { [ -n "$(losses cap.jsonl)" ] && [ "$(losses cap_pad.jsonl)" = "$(losses cap.jsonl)" ] &&
    pass "--moe-pad-expert-input-to-capacity: the losses bit for bit" || fail "padding to the capacity changed the losses"; }
# Group-limited routing: the experts in 2 groups, each token's from its best one.
run group_train "$LATTICE" train "${MOE[@]}" --moe-router-num-groups 2 --moe-router-group-topk 1 "${RUN[@]}" \
  --train-iters 3 --save grpckpt && grep -q '"moe_router_num_groups": *2' grpckpt/iter_0000003/*.json &&
  pass "group-limited routing trains and the checkpoint records it"
# seq_aux_loss: the load-balancing loss of each sequence, logged under Megatron's name.
if run seq_train "$LATTICE" train "${MOE[@]}" --moe-router-load-balancing-type seq_aux_loss --moe-z-loss-coeff 1e-3 \
     "${RUN[@]}" --train-iters 2 --metrics-file seq.jsonl; then
  grep -q 'lm loss: [^|]*| seq_load_balancing_loss: [0-9.E+-]* | z_loss: [0-9.E+-]* |' seq_train.out &&
    grep -q '"z_loss"' seq.jsonl && pass "--moe-z-loss-coeff logs z_loss after the load-balancing loss" ||
    fail "no z_loss logged"
  grep -q 'lm loss: [^|]*| seq_load_balancing_loss: [0-9.E+-]* |' seq_train.out &&
    grep -q '"seq_load_balancing_loss"' seq.jsonl && pass "seq_aux_loss logs seq_load_balancing_loss" ||
    fail "no seq_load_balancing_loss logged"
fi
# A list of types, one coefficient each (Megatron's): the micro-batch's and the global loss, both logged.
if run global_train "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-router-load-balancing-type aux_loss global_aux_loss \
     --moe-aux-loss-coeff 1e-2 1e-3 "${RUN[@]}" --train-iters 2 --metrics-file global.jsonl; then
  g=$(grep -o '"global_load_balancing_loss":[^,}]*' global.jsonl | tail -n 1 | cut -d: -f2)
  grep -q 'lm loss: [^|]*| load_balancing_loss: [0-9.E+-]* | global_load_balancing_loss: [0-9.E+-]* |' global_train.out &&
    grep -q '"load_balancing_loss"' global.jsonl && [ -n "$g" ] && awk -v v="$g" 'BEGIN { exit !(v >= 0.5 && v <= 4) }' &&
    pass "aux_loss global_aux_loss logs both losses (global $g)" || fail "a list of load-balancing types logged no global loss"
fi
expect_error "a coefficient missing from a list of types" "--moe-aux-loss-coeff" -- \
  "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-router-load-balancing-type aux_loss seq_aux_loss \
  --moe-aux-loss-coeff 1e-2 "${RUN[@]}" --train-iters 1
expect_error "sinkhorn in a list of types" "sinkhorn goes alone" -- \
  "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-router-load-balancing-type aux_loss sinkhorn \
  --moe-aux-loss-coeff 1e-2 0 "${RUN[@]}" --train-iters 1
expect_error "a type listed twice" "global_aux_loss twice" -- \
  "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-router-load-balancing-type global_aux_loss global_aux_loss \
  --moe-aux-loss-coeff 1e-2 1e-2 "${RUN[@]}" --train-iters 1
# MoE-layer recomputation: the same losses bit for bit, a smaller activation estimate.
if run rc_off "$LATTICE" train "${MOE[@]}" "${RUN[@]}" --train-iters 3 --hidden-dropout 0.1 --metrics-file rc_off.jsonl &&
   run rc_on "$LATTICE" train "${MOE[@]}" "${RUN[@]}" --train-iters 3 --hidden-dropout 0.1 --metrics-file rc_on.jsonl \
     --recompute-granularity selective --recompute-modules core_attn moe; then
  [ -n "$(losses rc_off.jsonl)" ] && [ "$(losses rc_on.jsonl)" = "$(losses rc_off.jsonl)" ] &&
    pass "--recompute-modules core_attn moe: the losses bit for bit" || fail "MoE recomputation changed the losses"
  run rc_act "$LATTICE" train "${MOE[@]}" "${RUN[@]}" --train-iters 3 --hidden-dropout 0.1 --metrics-file rc_act.jsonl \
    --recompute-granularity selective --recompute-modules moe_act layernorm &&
    { [ "$(losses rc_act.jsonl)" = "$(losses rc_off.jsonl)" ] &&
      pass "--recompute-modules moe_act layernorm: the losses bit for bit" ||
      fail "moe_act / layernorm recomputation changed the losses"; }
fi
expect_error "MoE recomputation with fp8" "--moe-layer-recompute|--fp8-recipe delayed" -- \
  "$LATTICE" train "${MOE[@]}" "${RUN[@]}" --train-iters 1 --bf16 --fp8-format hybrid --moe-layer-recompute --save bad14
# Sinkhorn routing (no load-balancing loss): trains; its checkpoint records the softmax-over-all gates it
# implies, with which generation (top k of the gates) runs.
if run sink_train "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-router-load-balancing-type sinkhorn "${RUN[@]}" \
     --train-iters 3 --save sinkckpt; then
  grep -q '"moe_router_pre_softmax": *true' sinkckpt/iter_0000003/*.json &&
    run sink_gen "$LATTICE" generate --load sinkckpt --prompt "ab" --max-new-tokens 8 --seed 2 &&
    pass "sinkhorn routing trains; its checkpoint generates" || fail "the sinkhorn checkpoint lacks pre-softmax gates or does not generate"
fi
# The independent HuggingFace fixtures in (tests/fixtures/make_hf_llama_fixture.py).
for f in hf_mixtral_tiny hf_qwen3_moe_tiny hf_qwen2_moe_tiny hf_deepseek_moe_tiny; do
  run "$f" "$LATTICE" convert --from-hf "$SRC/tests/fixtures/$f" --save "ckpt-$f" &&
    grep -q '"num_experts": *4' "ckpt-$f"/iter_0000000/*.json && pass "$f converts: $(tail -n 1 "$f.err")" ||
    fail "$f did not convert with its experts"
done
# GPT-OSS-style: experts and router with biases, the clamped quick GEGLU with the up projection's offset,
# learnable sinks, a window on every other layer, YaRN. It trains, records its biases and unit, resumes
# by --use-checkpoint-args, generates the same text with and without the KV cache, and goes to
# HuggingFace GPT-OSS and back generating the same text; without sinks it has no HF form.
OSS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
     --seq-length 32 --max-position-embeddings 32 --normalization RMSNorm
     --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7 --softmax-type learnable
     --window-size 7,0 --window-attn-skip-freq 2 "${EXPERTS[@]}" --moe-aux-loss-coeff 0.01
     --position-embedding-type yarn --yarn-rotary-scaling-factor 4 --yarn-original-max-position-embeddings 8
     --tokenizer-type ByteTokenizer)
if run oss_train "$LATTICE" train "${OSS[@]}" "${RUN[@]}" --train-iters 12 --exit-interval 8 --save oss \
     --metrics-file oss.jsonl; then
  first=$(losses oss.jsonl | head -n 1)
  last=$(losses oss.jsonl | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' &&
    pass "a GPT-OSS-style model trains: lm loss $first -> $last" || fail "the GPT-OSS-style model's loss did not fall: $first -> $last"
  j=(oss/iter_0000008/*.json)
  grep -qF 'decoder.layers.1.mlp.router.bias' "${j[@]}" && grep -qF 'mlp.experts.local_experts.3.linear_fc1.bias' "${j[@]}" &&
    grep -qF 'mlp.experts.local_experts.3.linear_fc2.bias' "${j[@]}" && grep -q '"quick_geglu": *true' "${j[@]}" &&
    grep -q '"activation_func_clamp_value": *7' "${j[@]}" && grep -q '"glu_linear_offset": *1' "${j[@]}" &&
    pass "the checkpoint records the router's and the experts' biases and the gated unit's form" ||
    fail "the GPT-OSS-style checkpoint lost its biases or its unit"
  run oss_resume "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --moe-aux-loss-coeff 0.01 --train-iters 12 \
    --load oss --save oss2 && grep -q '"quick_geglu": *true' oss2/iter_0000012/*.json &&
    pass "--use-checkpoint-args resumes the GPT-OSS-style model"
  run oss_gen "$LATTICE" generate --load oss --prompt "ab" --max-new-tokens 24 --seed 2 &&
    run oss_gen_full "$LATTICE" generate --load oss --prompt "ab" --max-new-tokens 24 --seed 2 --no-kv-cache &&
    { cmp -s oss_gen.out oss_gen_full.out && pass "the GPT-OSS-style model generates the same text with and without the KV cache" ||
        fail "the GPT-OSS-style model generates differently with and without the KV cache"; }
  if run oss_to_hf "$LATTICE" convert --load oss --to-hf hf-oss; then
    grep -q '"model_type": "gpt_oss"' hf-oss/config.json && grep -q '"sliding_attention"' hf-oss/config.json &&
      grep -q '"swiglu_limit": 7' hf-oss/config.json && pass "convert --to-hf wrote a GPT-OSS config" ||
      fail "convert --to-hf of the GPT-OSS-style model wrote no GPT-OSS config"
    run oss_from_hf "$LATTICE" convert --from-hf hf-oss --save oss-back &&
      run oss_gen_back "$LATTICE" generate --load oss-back --prompt "ab" --max-new-tokens 24 --seed 2 &&
      { cmp -s oss_gen.out oss_gen_back.out && pass "lattice -> HF GPT-OSS -> lattice generates the same text" ||
          fail "the model generates other text after the GPT-OSS round trip"; }
  fi
fi
if run oss_plain "$LATTICE" train "${OSS[@]/learnable/vanilla}" "${RUN[@]}" --train-iters 1 --save oss-plain; then
  expect_error "HF export of GPT-OSS's MLP without sinks" "--softmax-type learnable|neither" -- \
    "$LATTICE" convert --load oss-plain --to-hf hf-plain
  [ -e hf-plain ] && fail "a refused export wrote hf-plain"
fi
expect_error "shared experts with linear biases" "--disable-bias-linear" -- \
  "$LATTICE" train "${BASE[@]}" "${EXPERTS[@]}" --moe-shared-expert-intermediate-size 32 "${RUN[@]}" --train-iters 1 \
  --save bad1
expect_error "two gated units" "--swiglu and --quick-geglu" -- \
  "$LATTICE" train "${MOE[@]}" --quick-geglu "${RUN[@]}" --train-iters 1 --save bad14
expect_error "top-k above the experts" "--moe-router-topk|5" -- \
  "$LATTICE" train "${DENSE[@]}" --num-experts 4 --moe-router-topk 5 "${RUN[@]}" --train-iters 1 --save bad2
expect_error "a negative load-balancing coefficient" "--moe-aux-loss-coeff" -- \
  "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-aux-loss-coeff -1 "${RUN[@]}" --train-iters 1 --save bad3
expect_error "an unknown load-balancing type" "--moe-router-load-balancing-type|balanced" -- \
  "$LATTICE" train "${MOE[@]}" --moe-router-load-balancing-type balanced "${RUN[@]}" --train-iters 1 --save bad4
expect_error "sinkhorn with a load-balancing loss" "--moe-aux-loss-coeff|sinkhorn" -- \
  "$LATTICE" train "${MOE[@]}" --moe-router-load-balancing-type sinkhorn "${RUN[@]}" --train-iters 1 --save bad12
expect_error "sinkhorn with a capacity" "--moe-expert-capacity-factor|sinkhorn" -- \
  "$LATTICE" train "${DENSE[@]}" "${EXPERTS[@]}" --moe-router-load-balancing-type sinkhorn --moe-expert-capacity-factor 1 \
  "${RUN[@]}" --train-iters 1 --save bad13
expect_error "a shared-expert gate without shared experts" "--moe-shared-expert-gate" -- \
  "$LATTICE" train "${MOE[@]}" --moe-shared-expert-gate "${RUN[@]}" --train-iters 1 --save bad5
expect_error "the expert bias without sigmoid scores" "--moe-router-enable-expert-bias" -- \
  "$LATTICE" train "${MOE[@]}" --moe-router-enable-expert-bias "${RUN[@]}" --train-iters 1 --save bad7
expect_error "an unknown drop policy" "--moe-token-drop-policy" -- \
  "$LATTICE" train "${MOE[@]}" --moe-expert-capacity-factor 1 --moe-token-drop-policy random "${RUN[@]}" --train-iters 1 --save bad8
expect_error "padding without a capacity" "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor" -- \
  "$LATTICE" train "${MOE[@]}" --moe-pad-expert-input-to-capacity "${RUN[@]}" --train-iters 1 --save bad9
expect_error "groups that do not divide the experts" "--moe-router-num-groups" -- \
  "$LATTICE" train "${MOE[@]}" --moe-router-num-groups 3 --moe-router-group-topk 1 "${RUN[@]}" --train-iters 1 --save bad10
expect_error "an fp64 router" "--moe-router-dtype" -- \
  "$LATTICE" train "${MOE[@]}" --moe-router-dtype fp64 "${RUN[@]}" --train-iters 1 --save bad11
expect_error "a layer pattern of the wrong length" "--moe-layer-freq" -- \
  "$LATTICE" train "${MOE[@]}" --moe-layer-freq '[1,0,1]' "${RUN[@]}" --train-iters 1 --save bad6
[ -e bad1 ] || [ -e bad2 ] || [ -e bad4 ] || [ -e bad3 ] || [ -e bad5 ] || [ -e bad6 ] || [ -e bad7 ] || [ -e bad8 ] ||
  [ -e bad9 ] || [ -e bad10 ] || [ -e bad11 ] || [ -e bad12 ] || [ -e bad13 ] || [ -e bad14 ] &&
  fail "a refused run left a checkpoint behind"
e2e_finish
