#!/usr/bin/env bash
# A fatal signal is reported, not silent: the process prints one line naming the signal
# and the stack of the thread that received it (function names: the binary exports its
# symbols), then dies of the signal as before (exit status 128 + signal, so a caller, a
# core dump or a debugger sees the same as without the report).
#   bash tests/e2e/test_crash_report.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1
ulimit -c 0  # no core files from the deliberate crashes

ARGS=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 100000
      --lr 1e-3 --log-interval 1 --num-threads 1 --mock-data --vocab-size 64)

# crash SIGNAL NUMBER WHAT: a training run that has logged an iteration gets SIGNAL.
# The signal interrupts whatever the process is doing; when that is one of oneDNN's JIT
# GEMM kernels (code without unwind information) the stack ends there, which the report
# says, and the run is repeated (up to 5 times) until the signal lands in lattice's code.
crash() {
  local sig=$1 num=$2 what=$3 attempt
  for attempt in 1 2 3 4 5; do
    rm -f m.jsonl
    "$LATTICE" train "${ARGS[@]}" --metrics-file m.jsonl >out 2>err &
    local pid=$!
    wait_for m.jsonl '"iteration"' 30
    kill -s "$sig" "$pid"
    local rc=0
    wait "$pid" || rc=$?
    if [ "$rc" -ne $((128 + num)) ]; then
      fail "$sig: exit status $rc, expected $((128 + num)) (death by the signal, as without a report)"
    elif ! grep -qF "lattice train: fatal SIG$sig ($what" <<<"$(head -n 1 err)"; then
      fail "$sig: the first line of stderr does not name the signal: $(head -n 1 err)"
    elif grep -q "(_ZN7lattice" err; then
      pass "$sig: reported ($(grep -c "(_ZN7lattice" err) lattice frames) and exit status $rc"
    elif grep -qF "the stack ends in code generated at run time" err &&
         grep -qE '^\[0x[0-9a-f]+\]$' err; then
      echo "  ($sig, attempt $attempt: the signal landed in JIT code; again)"
      continue
    else
      fail "$sig: no lattice function on the reported stack:"
      sed 's/^/    /' err >&2
    fi
    return
  done
  fail "$sig: 5 signals in a row landed in JIT code"
}

crash SEGV 11 "invalid memory access"
crash ILL 4 "illegal instruction"
crash ABRT 6 "abort"
e2e_finish
