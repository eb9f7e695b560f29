#!/usr/bin/env bash
# Multi-token prediction from the command line (--mtp-num-layers, --mtp-loss-scaling-factor): a model
# with two prediction depths trains, logs Megatron's "mtp_<k> loss" beside the lm loss (and in
# --metrics-file), saves the depths' weights, resumes from its checkpoint to the straight run's losses,
# and resumes by --use-checkpoint-args; the main loss of the first iteration is the model's without
# the depths, later ones move, and with --mtp-loss-scaling-factor 0 every main loss is the plain
# model's; after MoE layers the depth's layer is an MoE layer; generate runs on the main model; the
# HuggingFace export says it drops the depths; bad
# combinations are one-line errors naming the flag, with nothing written.
#   bash tests/e2e/test_mtp_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MODEL=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
       --tokenizer-type ByteTokenizer)
MTP=(--mtp-num-layers 2 --mtp-loss-scaling-factor 0.3)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }
mtp_losses() { grep -o '"mtp_losses":\[[^]]*\]' "$1"; }

if run train "$LATTICE" train "${MODEL[@]}" "${MTP[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "a model with 2 prediction depths trains: lm loss $first -> $last" || fail "the loss did not fall: $first -> $last"
  grep -q 'lm loss: [^|]*| mtp_1 loss: [0-9.E+-]* | mtp_2 loss: [0-9.E+-]* |' train.out &&
    [ "$(mtp_losses m.jsonl | tail -n 1 | tr ',' '\n' | wc -l)" = 2 ] &&
    pass "the log and the metrics carry each depth's loss ($(mtp_losses m.jsonl | tail -n 1))" ||
    fail "no mtp_<k> losses logged"
  grep -q '"mtp_num_layers": *2' ckpt/iter_0000020/*.json && grep -qF 'mtp.layers.1.eh_proj.weight' ckpt/iter_0000020/*.json &&
    grep -qF 'mtp.layers.1.transformer_layer.self_attention.linear_qkv.weight' ckpt/iter_0000020/*.json &&
    pass "the checkpoint records the depths and their weights" || fail "the checkpoint lost the prediction depths"
  # The resumed run ends as the straight one: every loss of iterations 21-24, the depths' too.
  if run resume "$LATTICE" train "${MODEL[@]}" "${MTP[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt \
       --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" "${MTP[@]}" "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    want=$(tail -n 4 s.jsonl | grep -o '"lm_loss":[^,}]*\|"mtp_losses":\[[^]]*\]')
    got=$(grep -o '"lm_loss":[^,}]*\|"mtp_losses":\[[^]]*\]' r.jsonl)
    [ -n "$want" ] && [ "$got" = "$want" ] && pass "the resumed run's losses (main and depths) are the straight run's" ||
      fail "the resumed run differs from the straight one"
  fi
  expect_error "resume without --mtp-num-layers" "mtp_num_layers|--mtp-num-layers" -- \
    "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt3
  run resume_args "$LATTICE" train --use-checkpoint-args "${RUN[@]}" --train-iters 24 --load ckpt --ckpt-step 20 \
    --save ckpt2 --exit-interval 21 && grep -q '"mtp_num_layers": *2' ckpt2/iter_0000021/*.json && grep -q 'mtp_2 loss' resume_args.out &&
    pass "--use-checkpoint-args resumes the prediction depths"
  run gen "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 16 --seed 2 &&
    run gen_full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 16 --seed 2 --no-kv-cache &&
    { cmp -s gen.out gen_full.out && pass "generate runs the main model (the same text with and without the KV cache)" ||
        fail "generate differs with and without the KV cache"; }
  run to_hf "$LATTICE" convert --load ckpt --to-hf hf && grep -q "multi-token prediction depths (mtp.layers.\*) are not exported" to_hf.err &&
    pass "convert --to-hf says the depths stay behind" || fail "convert --to-hf dropped the depths silently"
fi

# The depths change the main model's training only through their gradients: the first iteration's
# main loss is the plain model's (the same initial weights), later ones differ; with a scaling factor
# of 0 the depths' gradient is exactly zero and every main loss is the plain model's.
if run plain "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 4 --metrics-file p.jsonl &&
   run with "$LATTICE" train "${MODEL[@]}" "${MTP[@]}" "${RUN[@]}" --train-iters 4 --metrics-file w.jsonl &&
   run zero "$LATTICE" train "${MODEL[@]}" --mtp-num-layers 2 --mtp-loss-scaling-factor 0 "${RUN[@]}" --train-iters 4 \
     --metrics-file z.jsonl; then
  p1=$(field p.jsonl lm_loss | head -n 1); w1=$(field w.jsonl lm_loss | head -n 1)
  p4=$(field p.jsonl lm_loss | tail -n 1); w4=$(field w.jsonl lm_loss | tail -n 1)
  [ -n "$p1" ] && [ "$p1" = "$w1" ] && [ "$p4" != "$w4" ] &&
    pass "the first main loss is the plain model's ($p1), the depths' gradients move the later ones ($p4 -> $w4)" ||
    fail "main losses with and without the depths: first $p1 / $w1, last $p4 / $w4"
  [ "$(field p.jsonl lm_loss)" = "$(field z.jsonl lm_loss)" ] &&
    pass "--mtp-loss-scaling-factor 0: every main loss is the plain model's" ||
    fail "--mtp-loss-scaling-factor 0 changed the main losses"
fi

# Under pipeline parallelism the depths run on the last stage, their lookup through its copy of the word
# embedding (an untied model's own, summed with the first stage's): a run saved at PP=2 resumes at one
# process to the straight PP=2 run's losses (1e-5 relative), the depths' included.
PP=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
    --position-embedding-type rope --untie-embeddings-and-output-weights --vocab-size 64 --micro-batch-size 1
    --global-batch-size 4 --mock-data --log-interval 1 --eval-iters 0 --lr 1e-3 --hidden-dropout 0.1 --seed 7
    --train-iters 12 "${MTP[@]}")
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 2)
if run pp_straight env OMP_NUM_THREADS=1 "${MPIRUN[@]}" "$LATTICE" train "${PP[@]}" --pipeline-model-parallel-size 2 \
     --metrics-file pp_s.jsonl &&
   run pp_save env OMP_NUM_THREADS=1 "${MPIRUN[@]}" "$LATTICE" train "${PP[@]}" --pipeline-model-parallel-size 2 \
     --exit-interval 6 --save pp_ckpt &&
   run pp_resume "$LATTICE" train "${PP[@]}" --load pp_ckpt --metrics-file pp_r.jsonl; then
  want=$(tail -n 6 pp_s.jsonl | grep -o '"lm_loss":[^,}]*\|"mtp_losses":\[[^]]*\]' | tr -d '"a-z_:[]' | tr ',' '\n')
  got=$(grep -o '"lm_loss":[^,}]*\|"mtp_losses":\[[^]]*\]' pp_r.jsonl | tr -d '"a-z_:[]' | tr ',' '\n')
  if [ -n "$want" ] && [ "$(echo "$want" | wc -l)" = "$(echo "$got" | wc -l)" ] &&
     paste <(echo "$want") <(echo "$got") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1 } END { exit bad }'; then
    pass "a PP=2 run with the depths resumes at one process to the straight run's losses ($(echo "$got" | wc -l) values)"
  else
    fail "the PP=2 checkpoint resumed at one process differs: want $(echo $want) got $(echo $got)"
  fi
fi

expect_error "negative depths" "--mtp-num-layers must be >= 0" -- \
  "$LATTICE" train "${MODEL[@]}" --mtp-num-layers -1 "${RUN[@]}" --train-iters 1 --save bad1
expect_error "negative scaling factor" "--mtp-loss-scaling-factor must be a finite number >= 0" -- \
  "$LATTICE" train "${MODEL[@]}" --mtp-num-layers 1 --mtp-loss-scaling-factor -1 "${RUN[@]}" --train-iters 1 --save bad2
# After MoE layers the depth's layer is an MoE layer: its router's load-balancing loss is logged with the
# decoder's (the mean over every MoE layer; --moe-per-layer-logging lists it as layer 2).
if run moe "$LATTICE" train "${MODEL[@]}" --disable-bias-linear --num-experts 4 --moe-aux-loss-coeff 0.01 \
     --moe-per-layer-logging --mtp-num-layers 1 "${RUN[@]}" --train-iters 4 --save moe_ckpt --metrics-file moe.jsonl; then
  grep -q 'load_balancing_loss: [^|]*|.* mtp_1 loss: ' moe.out &&
    grep -q '"load_balancing_loss_layers":\[[^],]*,[^],]*,[^],]*\]' moe.jsonl &&
    grep -qF 'mtp.layers.0.transformer_layer.mlp.experts.local_experts.3.linear_fc2.weight' moe_ckpt/iter_0000004/*.json &&
    pass "an MoE model's prediction depth is an MoE layer (its experts saved, its balance logged as layer 2)" ||
    fail "the MoE model's prediction depth is not an MoE layer"
fi
expect_error "pipeline parallelism with learned positions" \
  "--mtp-num-layers with --pipeline-model-parallel-size > 1 needs --position-embedding-type rope or none" -- \
  "$LATTICE" train "${MODEL[@]}" --mtp-num-layers 1 --pipeline-model-parallel-size 2 "${RUN[@]}" --train-iters 1 --save bad4
# eh_proj splits the hidden size's outputs over the tensor-parallel ranks: each rank says so, in the same line.
rc=0
timeout 120 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 3 "$LATTICE" train --num-layers 2 \
  --hidden-size 32 --num-attention-heads 3 --kv-channels 8 --ffn-hidden-size 48 --seq-length 16 \
  --max-position-embeddings 16 --vocab-size 60 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --mock-data \
  --eval-iters 0 --tensor-model-parallel-size 3 --mtp-num-layers 1 --save bad5 > tp3.log 2>&1 || rc=$?
errors=$(grep -F "lattice train: error:" tp3.log | sort -u)
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(printf '%s\n' "$errors" | grep -c .)" = 1 ] &&
  grep -qF -- "--hidden-size 32 is not divisible by --tensor-model-parallel-size 3 (required by --mtp-num-layers" <<< "$errors" &&
  ! grep -q " iteration " tp3.log && pass "hidden size not split by TP 3: $errors" ||
  fail "TP 3 with hidden size 32 and the depths (rc $rc): $(tail -3 tp3.log)"
[ -e bad1 ] || [ -e bad2 ] || [ -e bad4 ] || [ -e bad5 ] || [ -e ckpt3 ] &&
  fail "a refused run left a checkpoint behind"
e2e_finish
