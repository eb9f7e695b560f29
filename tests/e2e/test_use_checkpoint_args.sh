#!/usr/bin/env bash
# --use-checkpoint-args (Megatron's): the model and tokenizer flags a run does not give are the
# --load checkpoint's. A resume with only the training flags continues exactly as a resume with
# every flag (the same losses, bit for bit); a flag given on the command line is kept, and one that
# contradicts the checkpoint's model is the load's one-line error; a checkpoint converted from
# HuggingFace (which records no training flags) fine-tunes from its model_config alone.
#   bash tests/e2e/test_use_checkpoint_args.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

losses() { grep -o '"lm_loss":[^,}]*' "$1"; }

# A model far from the defaults: rope (half the dims, base 20000), RMSNorm, SwiGLU, 2 query groups,
# no linear biases, untied, its own head width and epsilon, ByteTokenizer.
MODEL=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --kv-channels 16 --ffn-hidden-size 64
       --seq-length 16 --max-position-embeddings 32 --position-embedding-type rope --rotary-percent 0.5
       --rotary-base 20000 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --group-query-attention
       --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights
       --tokenizer-type ByteTokenizer)
RUN=(--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --log-interval 1 --seed 5 --mock-data --eval-iters 0)

run first "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 4 --exit-interval 2 --save ckpt || { e2e_finish; }
run all_flags "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 4 --load ckpt --save ckpt_all \
  --metrics-file all.jsonl
if run ckpt_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 4 --load ckpt --save ckpt_args \
     --metrics-file args.jsonl; then
  [ "$(losses args.jsonl | wc -l)" -eq 2 ] && [ "$(losses args.jsonl)" = "$(losses all.jsonl)" ] &&
    pass "--use-checkpoint-args: iterations 3-4 have the losses of the resume with every flag: $(losses args.jsonl | tr '\n' ' ')" ||
    fail "--use-checkpoint-args: losses $(losses args.jsonl | tr '\n' ' ') differ from $(losses all.jsonl | tr '\n' ' ')"
  grep -q '"swiglu": *true' ckpt_args/iter_0000004/*.json && grep -q '"num_query_groups": *2' ckpt_args/iter_0000004/*.json &&
    pass "the saved model is the checkpoint's (SwiGLU, 2 query groups)" ||
    fail "the checkpoint saved under --use-checkpoint-args lost the model's settings"
fi

# --skip-train: the evaluations of the end of training, on a checkpoint, without training. The run that
# trains from iteration 2 to 4 evaluates at 4; --skip-train on the checkpoint it saved evaluates the same.
EVAL=(--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --log-interval 1 --seed 5 --mock-data --eval-iters 2)
if run eval_trained "$LATTICE" train --use-checkpoint-args "${EVAL[@]}" --train-iters 4 --load ckpt --save ckpt_eval \
     --metrics-file eval_trained.jsonl &&
   run eval_only "$LATTICE" train --use-checkpoint-args "${EVAL[@]}" --train-iters 4 --load ckpt_eval --skip-train \
     --save ckpt_skip --metrics-file eval_only.jsonl; then
  want=$(grep -o '"\(val\|test\)_loss":[^,}]*' eval_trained.jsonl | tr '\n' ' ')
  got=$(grep -o '"\(val\|test\)_loss":[^,}]*' eval_only.jsonl | tr '\n' ' ')
  [ -n "$want" ] && [ "$got" = "$want" ] && pass "--skip-train evaluates the checkpoint as the end of its training did: $got" ||
    fail "--skip-train: '$got', want '$want'"
  grep -q 'iteration 4 on validation set' eval_only.out && grep -q 'iteration 4 on test set' eval_only.out ||
    fail "--skip-train did not print the evaluations at iteration 4"
  grep -q '"lm_loss"' eval_only.jsonl && fail "--skip-train trained (its metrics file has an lm_loss line)"
  [ -e ckpt_skip ] && fail "--skip-train saved a checkpoint"
fi

# A flag given on the command line is kept: the same value is fine, another is the load's error.
run same_flag "$LATTICE" train --use-checkpoint-args --num-layers 2 "${RUN[@]}" --train-iters 4 --load ckpt &&
  pass "--use-checkpoint-args with --num-layers given as the checkpoint has it"
expect_error "a given flag that contradicts the checkpoint" "ckpt|num_layers|--num-layers" -- \
  "$LATTICE" train --use-checkpoint-args --num-layers 3 "${RUN[@]}" --train-iters 4 --load ckpt
expect_error "--use-checkpoint-args without --load" "--use-checkpoint-args|--load" -- \
  "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 3
expect_error "--use-checkpoint-args with a --load that is no checkpoint" "--use-checkpoint-args|--load|$TMP/empty|checkpoint" -- \
  "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 3 --load "$TMP/empty"

# A HuggingFace Llama converted to lattice: no training flags recorded, the model from model_config
# (grouped-query attention, head_dim 16, rope_theta 500000, untied, vocabulary 101 without a tokenizer).
if run convert "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_llama_tiny" --save ckpt_hf; then
  if run finetune "$LATTICE" train --use-checkpoint-args --load ckpt_hf --finetune "${RUN[@]}" --seq-length 16 \
       --train-iters 2 --save ckpt_ft; then
    grep -q '"rotary_base": *500000' ckpt_ft/iter_0000002/*.json && grep -q '"kv_channels": *16' ckpt_ft/iter_0000002/*.json &&
      pass "--use-checkpoint-args --finetune of a converted HF Llama trains its model" ||
      fail "the fine-tuned converted Llama does not have the HF model's settings"
  fi
fi

# A HuggingFace Phi-3.5-style model (LongRoPE, half of each head rotated): its factors travel as the --longrope-*
# flags; fine-tuned at 16 tokens (past its original context of 8: the long factors), then out as Phi-3 again.
if run convert_lr "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_phi3_tiny_longrope" --save ckpt_lr; then
  if run finetune_lr "$LATTICE" train --use-checkpoint-args --load ckpt_lr --finetune "${RUN[@]}" --seq-length 16 \
       --train-iters 2 --save ckpt_lr_ft; then
    python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["model_config"]
assert m["longrope_short_factor"] == [1.0, 1.5] and m["longrope_long_factor"] == [3.0, 7.0], m
assert m["longrope_original_max_position_embeddings"] == 8 and m["rotary_percent"] == 0.5, m
' ckpt_lr_ft/iter_0000002/checkpoint.json 2>lr.py.err &&
      pass "--use-checkpoint-args --finetune of a converted LongRoPE Phi-3 keeps its factors" ||
      fail "the fine-tuned LongRoPE model lost its factors: $(tail -n 1 lr.py.err)"
    run lr_back "$LATTICE" convert --load ckpt_lr_ft --to-hf hf_lr &&
      grep -q '"type": "longrope"' hf_lr/config.json && grep -q '"model_type": "phi3"' hf_lr/config.json &&
      pass "the fine-tuned LongRoPE model goes out as Phi-3 with its rope_scaling" ||
      fail "LongRoPE export: $(grep -E 'model_type|type' hf_lr/config.json | head -3)"
  fi
fi
expect_error "--longrope-short-factor of the wrong length" "--longrope-short-factor has 3 factors|4 pairs" -- \
  "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 1 \
  --longrope-short-factor 1 1 1 --longrope-long-factor 2 2 2

# --use-mp-args-from-checkpoint-args (Megatron's): the tensor-parallel size the checkpoint was saved with too
# (--dry-run shows the layout two ranks would take; without the flag the two are data-parallel).
if command -v mpirun >/dev/null 2>&1 &&
   run tp_ckpt mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE" train "${MODEL[@]}" \
     "${RUN[@]}" --train-iters 1 --tensor-model-parallel-size 2 --save ckpt_tp; then
  OMPI_COMM_WORLD_SIZE=2 "$LATTICE" train --use-checkpoint-args --use-mp-args-from-checkpoint-args "${RUN[@]}" \
    --train-iters 2 --load ckpt_tp --dry-run >mp.out 2>&1
  OMPI_COMM_WORLD_SIZE=2 "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 2 --load ckpt_tp --dry-run \
    >nomp.out 2>&1
  grep -q "world 2 = tp 2 x pp 1 x dp 1" mp.out && grep -q "world 2 = tp 1 x pp 1 x dp 2" nomp.out &&
    pass "--use-mp-args-from-checkpoint-args takes the checkpoint's tensor-parallel size 2" ||
    fail "--use-mp-args-from-checkpoint-args: $(grep 'dry run' mp.out) / without: $(grep 'dry run' nomp.out)"
fi

e2e_finish
