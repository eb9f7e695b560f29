#!/usr/bin/env bash
# Expert parallelism from the command line (--expert-model-parallel-size): a mixture-of-experts run
# on 4 ranks with the experts split over 2 (DP 4 = EP 2 x expert DP 2, the distributed optimizer,
# evaluation during training) equals one process over its first 10 iterations and saves a
# checkpoint holding every expert of every layer under its global number; it resumes at EP 2 on 2
# ranks, at EP 4 on 4, at CP 2 x EP 2 on 4 and on one process, and each resumed run's losses and final parameters equal
# an uninterrupted single-process run's (to 1e-5 relative: only reduction order differs;
# ckpt_resume_lib.sh). With --expert-tensor-parallel-size 1 (TP 2 x EP 2, each expert whole) the
# same, and its checkpoint resumes under the other layouts. fp8 at EP 2 saves every expert's scaling state. Bad layouts are one-line errors naming the flag, with
# nothing written; Megatron's MoE implementation flags are accepted and change nothing.
#   bash tests/e2e/test_dist_ep_checkpoint.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_resume_lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 24 --moe-aux-loss-coeff 0.01 --disable-bias-linear)
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
       --global-batch-size 8 --mock-data --vocab-size 64 --log-interval 1 --lr 1e-3 --eval-interval 3 --eval-iters 1
       --hidden-dropout 0.1 --attention-dropout 0.1 --seed 7 "${MOE[@]}")
write_assembler
BASELINE="single-process"

OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" --train-iters 20 --save straight > straight.log 2>&1 ||
  fail "straight run failed: $(tail -2 straight.log)"
"${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" --train-iters 20 --exit-interval 10 --use-distributed-optimizer \
  --expert-model-parallel-size 2 --save ckpt > ep2.log 2>&1 || fail "EP=2 run failed: $(tail -2 ep2.log)"
[[ -f ckpt/latest_checkpointed_iteration.txt ]] || fail "EP=2 run wrote no checkpoint"
# The first ten iterations and the validation losses as the single process's.
want=$(losses straight.log | head -10 | tr '\n' ' ')
got=$(losses ep2.log | tr '\n' ' ')
close_values 10 "$got" "$want" &&
  pass "EP=2 x expert DP=2: the first 10 losses equal the single process's" || fail "EP=2 losses '$got', single process '$want'"
vl() { grep 'validation loss' "$1" | grep -o 'lm loss value: [0-9.E+-]*' | awk '{print $NF}' | head -3 | tr '\n' ' '; }
close_values 3 "$(vl ep2.log)" "$(vl straight.log)" &&
  pass "EP=2: the validation losses $(vl ep2.log)equal the single process's" ||
  fail "EP=2 validation losses '$(vl ep2.log)', single process '$(vl straight.log)'"
missing=0
for l in 0 1; do
  for e in 0 1 2 3; do
    for w in linear_fc1 linear_fc2; do
      for prefix in "" optimizer.exp_avg. optimizer.exp_avg_sq.; do
        grep -qF "\"${prefix}decoder.layers.$l.mlp.experts.local_experts.$e.$w.weight\"" ckpt/iter_0000010/checkpoint.json ||
          { missing=1; echo "  missing ${prefix}layer $l expert $e $w" >&2; }
      done
    done
  done
done
[ $missing = 0 ] && pass "the EP=2 checkpoint holds all 4 experts of each layer, with their Adam state" ||
  fail "the EP=2 checkpoint misses experts"

# Resumed under other expert-parallel layouts (ckpt_resume_lib.sh: iterations 11..20 and the final
# parameters against the uninterrupted run's).
resume "EP=2 on 4 ranks -> EP=2 on 2" ckpt 2 --train-iters 20 --use-distributed-optimizer --expert-model-parallel-size 2
resume "EP=2 on 4 ranks -> EP=4 on 4" ckpt 4 --train-iters 20 --use-distributed-optimizer --expert-model-parallel-size 4
resume "EP=2 on 4 ranks -> one process" ckpt 1 --train-iters 20
resume "EP=2 on 4 ranks -> CP=2 x EP=2 on 4" ckpt 4 --train-iters 20 --use-distributed-optimizer \
  --expert-model-parallel-size 2 --context-parallel-size 2

# --expert-tensor-parallel-size 1: TP 2 x EP 2 on 2 ranks, each expert whole on one of them and each rank
# routing its own sequence-parallel rows. Its first 10 losses are the single process's; its checkpoint
# resumes on one process and at TP 2 with the experts split (ETP = TP), and the EP 2 checkpoint resumes
# at TP 2 x DP 2 and at TP 2 x CP 2 with the experts whole over all four ranks (EP 4).
WHOLE=(--tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1)
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 20 --exit-interval 10 "${WHOLE[@]}" \
  --expert-model-parallel-size 2 --save ckpt-whole > whole.log 2>&1 || fail "TP=2 x EP=2 whole-expert run failed: $(tail -2 whole.log)"
got=$(losses whole.log | tr '\n' ' ')
close_values 10 "$got" "$want" &&
  pass "TP=2 x EP=2 with whole experts: the first 10 losses equal the single process's" ||
  fail "whole-expert losses '$got', single process '$want'"
grep -q "each expert whole" whole.log && pass "the whole-expert layout is logged" || fail "no whole-expert layout line"
resume "TP=2 x EP=2 whole experts -> one process" ckpt-whole 1 --train-iters 20
resume "TP=2 x EP=2 whole experts -> TP=2 split experts" ckpt-whole 2 --train-iters 20 --tensor-model-parallel-size 2 \
  --sequence-parallel
resume "EP=2 on 4 ranks -> TP=2 x DP=2 x EP=4 whole experts" ckpt 4 --train-iters 20 --use-distributed-optimizer \
  "${WHOLE[@]}" --expert-model-parallel-size 4
resume "EP=2 on 4 ranks -> TP=2 x CP=2 x EP=4 whole experts" ckpt 4 --train-iters 20 "${WHOLE[@]}" \
  --context-parallel-size 2 --expert-model-parallel-size 4

# fp8 (hybrid, with bf16) at EP 2: each expert's delayed-scaling state reaches the checkpoint from
# a rank that holds it, and the run resumes in one process; likewise at TP 2 x EP 2 with whole experts.
fp8_experts_saved() {  # CHECKPOINT_JSON: every expert's fc1 and fc2 scaling state is there
  python3 - "$1" <<'PY'
import json, sys
def find(o):
    if isinstance(o, dict):
        if "fp8" in o: return o["fp8"]
        for v in o.values():
            r = find(v)
            if r is not None: return r
    return None
fp8 = find(json.load(open(sys.argv[1]))) or {}
want = ["decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc%d.weight" % (l, e, f)
        for l in (0, 1) for e in range(4) for f in (1, 2)]
missing = [w for w in want if w not in fp8]
print("fp8 states: %d, experts' missing: %s" % (len(fp8), missing))
sys.exit(1 if missing else 0)
PY
}
if "${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" --train-iters 4 --exit-interval 2 --bf16 --fp8-format hybrid \
     --use-distributed-optimizer --expert-model-parallel-size 2 --save ckpt-fp8 > fp8.log 2>&1; then
  if fp8_experts_saved ckpt-fp8/iter_0000002/checkpoint.json; then
    pass "fp8 at EP 2: the checkpoint holds every expert's scaling state"
  else
    fail "fp8 at EP 2: experts' scaling states missing from the checkpoint"
  fi
  OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" --train-iters 4 --bf16 --fp8-format hybrid --use-distributed-optimizer \
    --load ckpt-fp8 --save ckpt-fp8 > fp8-resume.log 2>&1 && [ "$(losses fp8-resume.log | wc -l)" = 2 ] &&
    pass "fp8: the EP 2 checkpoint resumes in one process" || fail "fp8 resume failed: $(tail -2 fp8-resume.log)"
else
  fail "fp8 run at EP 2 failed: $(tail -2 fp8.log)"
fi
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 2 --bf16 --fp8-format hybrid "${WHOLE[@]}" \
  --expert-model-parallel-size 2 --save ckpt-fp8-whole > fp8-whole.log 2>&1 &&
  fp8_experts_saved ckpt-fp8-whole/iter_0000002/checkpoint.json &&
  pass "fp8 at TP 2 x EP 2 with whole experts: the checkpoint holds every expert's scaling state" ||
  fail "fp8 with whole experts: $(tail -2 fp8-whole.log)"

# Megatron's MoE implementation flags change nothing: the first iterations bit for bit.
OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" --train-iters 20 --exit-interval 3 --moe-grouped-gemm --moe-permute-fusion --moe-shared-expert-overlap \
  --moe-token-dispatcher-type alltoall --expert-tensor-parallel-size 1 > impl.log 2>&1 || fail "run with MoE implementation flags failed: $(tail -2 impl.log)"
[ "$(losses impl.log | wc -l)" = 3 ] && [ "$(losses impl.log | tr '\n' ' ')" = "$(losses straight.log | head -3 | tr '\n' ' ')" ] &&
  pass "--moe-grouped-gemm --moe-permute-fusion --moe-shared-expert-overlap --moe-token-dispatcher-type alltoall leave the losses identical" ||
  fail "the MoE implementation flags changed the losses: $(losses impl.log | tr '\n' ' ')"
expect_error "flex dispatcher" "--moe-token-dispatcher-type must be alltoall or allgather, got 'flex'" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --moe-token-dispatcher-type flex --save bad5
expect_error "expert tensor parallelism" "--expert-tensor-parallel-size 2 is neither 1 nor --tensor-model-parallel-size 1" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --expert-tensor-parallel-size 2 --save bad6
expect_error "whole experts without sequence parallelism" "--expert-tensor-parallel-size 1 needs --sequence-parallel" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --tensor-model-parallel-size 2 --expert-tensor-parallel-size 1 --save bad7

# Bad layouts: one line naming the flag, a non-zero exit, nothing written.
expect_error "experts not divisible" "--num-experts 4 is not divisible by --expert-model-parallel-size 3" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --expert-model-parallel-size 3 --save bad1
expect_error "no experts" "--expert-model-parallel-size 2 needs --num-experts" -- \
  "$LATTICE" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1 \
  --global-batch-size 8 --mock-data --vocab-size 64 --lr 1e-3 --train-iters 2 --expert-model-parallel-size 2 --save bad2
# Under mpirun every rank prints the same line (mpirun may stop some first).
rc=0
timeout 120 "${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 2 --expert-model-parallel-size 4 --save bad3 \
  > bad3.log 2>&1 || rc=$?
lines=$(grep -F "lattice train: error:" bad3.log | sort -u)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c . <<<"$lines")" = 1 ] && ! grep -q " iteration " bad3.log &&
   grep -qF -- "--expert-model-parallel-size 4 does not divide the data-parallel size 2" <<<"$lines"; then
  pass "ep above the data-parallel size: $lines"
else
  fail "ep above the data-parallel size: exit $rc, error lines: $lines"
fi
for d in bad1 bad2 bad3 bad5 bad6 bad7; do [ -e "$d" ] && fail "a refused run wrote $d"; done
e2e_finish
