#!/usr/bin/env bash
# The trainer's whole GPU path, without a GPU: `lattice-simt train --device cuda` (the CLI on
# the SIMT emulation: lattice's CUDA kernels, cuBLASLt and NCCL calls run on the CPU, NCCL's
# communicators over MPI; docs/cuda.md) against `lattice train --device cpu`, for each
# parallel layout: one rank in fp32 with dropout, in bf16, fp16 (loss scaling), fp8 and with
# full activation recomputation; under mpirun, tensor parallel,
# data parallel with the distributed optimizer and bf16 gradient reduction, pipeline
# parallel (1F1B, and interleaved), and tensor x pipeline on 4 ranks. Every iteration's loss
# and gradient norm must agree to 1e-5 relative (fp32: the two backends reduce in different
# orders, ~1e-7 apart; a wrong index, mask, scale or a lost message is 1e-2 or more); bf16,
# fp16 and fp8 to 1e-3 (the GEMMs and the attention round at different places: 2e-5
# measured over 3 iterations, against a unit roundoff of 4e-3 in bf16). A hang (a deadlock between ranks) fails at the
# time limit.
#   bash tests/simt/e2e_parallel_layouts.sh <lattice> <source dir> <lattice-simt>
set -u -o pipefail
source "$(dirname "$0")/../e2e/lib.sh"
e2e_init "$1" "$2"
SIMT=$(realpath "$3")
cd "$TMP" || exit 1

BASE=(--hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --train-iters 3 --log-interval 1 --seed 1234
      --mock-data --vocab-size 96 --make-vocab-size-divisible-by 32 --eval-iters 0
      --hidden-dropout 0.1 --attention-dropout 0.1 --peak-tflops 1 --num-threads 1)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
LIMIT=240  # seconds per run

# run NAME RANKS BINARY DEVICE FLAGS...: the run's metrics in NAME.jsonl
run() {
  local name=$1 ranks=$2 bin=$3 device=$4
  shift 4
  local cmd=("$bin" train "${BASE[@]}" "$@" --device "$device" --metrics-file "$name.jsonl")
  [ "$ranks" -gt 1 ] && cmd=("${MPIRUN[@]}" -np "$ranks" "${cmd[@]}")
  local rc=0
  timeout "$LIMIT" "${cmd[@]}" >"$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && fail "$name: no result after ${LIMIT} s (a deadlock?): ${cmd[*]}" ||
      fail "$name: exited $rc: ${cmd[*]}"
    tail -n 5 "$name.log" | sed 's/^/    /' >&2
    return 1
  fi
}

# field FILE KEY: the values of "KEY" in a JSONL file, one per line
field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

# agree NAME TOL: NAME-cpu and NAME-simt have the same iterations, losses and gradient norms within TOL (relative)
agree() {
  local name=$1 tol=$2 key worst
  for key in lm_loss grad_norm; do
    worst=$(paste <(field "$name-cpu.jsonl" $key) <(field "$name-simt.jsonl" $key) |
      awk -v tol="$tol" 'NF != 2 || $1 == "" { bad = 1 }
        { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = d / (a > 0 ? a : 1); if (r > w) w = r; n++ }
        END { if (bad || n != 3) print "mismatch"; else printf "%.2e\n", w }')
    if [ "$worst" = "mismatch" ]; then
      fail "$name: $key: the runs logged different iterations"
    elif awk -v w="$worst" -v t="$tol" 'BEGIN { exit !(w <= t) }'; then
      pass "$name: $key over 3 iterations within $worst relative (tolerance $tol)"
    else
      fail "$name: $key differs by $worst relative (tolerance $tol)"
      paste <(field "$name-cpu.jsonl" $key) <(field "$name-simt.jsonl" $key) | sed 's/^/    cpu, simt: /' >&2
    fi
  done
}

# layout NAME RANKS TOL FLAGS...: the CPU and the emulated GPU run of one layout
layout() {
  local name=$1 ranks=$2 tol=$3
  shift 3
  [[ " $* " == *" --num-layers "* ]] || set -- --num-layers 2 "$@"
  run "$name-cpu" "$ranks" "$LATTICE" cpu "$@" && run "$name-simt" "$ranks" "$SIMT" cuda "$@" && agree "$name" "$tol"
}

layout one-rank-fp32 1 1e-5
layout one-rank-bf16 1 1e-3 --bf16
layout one-rank-fp16 1 1e-3 --fp16 --initial-loss-scale 4096
layout one-rank-fp8 1 1e-3 --bf16 --fp8-format hybrid
layout one-rank-recompute 1 1e-5 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
if command -v mpirun >/dev/null 2>&1; then
  layout tensor-parallel-2 2 1e-5 --tensor-model-parallel-size 2 --sequence-parallel
  layout data-parallel-2-distributed-optimizer 2 1e-5 --use-distributed-optimizer --overlap-grad-reduce
  layout data-parallel-2-bf16-reduce 2 1e-3 --bf16 --grad-reduce-in-bf16
  layout pipeline-2 2 1e-5 --pipeline-model-parallel-size 2
  layout pipeline-2-interleaved 2 1e-5 --pipeline-model-parallel-size 2 --num-layers 4 \
    --num-layers-per-virtual-pipeline-stage 1
  layout tensor-2-pipeline-2 4 1e-5 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
else
  fail "mpirun not found: the parallel layouts were not run"
fi
grep -h "device: cuda" one-rank-fp32-simt.log >/dev/null || fail "the emulated run did not select a CUDA device"

e2e_finish
