#!/usr/bin/env bash
# Bad tensor-parallel layouts: heads, FFN width or sequence length not divisible by
# --tensor-model-parallel-size, a world size that is no multiple of TP x PP, and TP > 1
# without mpirun. Each ends with a non-zero exit and an error line naming the flag, before
# any iteration. Single-process cases must print exactly one stderr line; under mpirun
# every rank prints the same line and mpirun adds its own banner, so those cases check
# that lattice's lines name the flags and are all the same.
#   bash tests/e2e/test_tp_errors.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MPIRUN=(timeout 120 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
# A tiny model; each case adds --hidden-size, --num-attention-heads and --seq-length.
REST=(--num-layers 1 --micro-batch-size 1 --global-batch-size 4 --train-iters 2 --log-interval 1
      --eval-iters 0 --mock-data --vocab-size 64)

# mpi_error NAME NP "PATTERN1|PATTERN2..." -- lattice args...
# Runs `mpirun -np NP lattice ARGS`; asserts a non-zero exit within the timeout, no
# iteration logged, and that lattice's error lines (1 to NP of them: mpirun may end the
# other ranks first) are identical and contain every '|'-separated fixed string.
mpi_error() {
  local name=$1 np=$2 patterns=$3
  shift 3
  [ "$1" = "--" ] && shift
  local log=$TMP/$name.log rc=0
  "${MPIRUN[@]}" -np "$np" "$LATTICE" "$@" >"$log" 2>&1 || rc=$?
  local lines n distinct ok=1
  lines=$(grep -F "lattice train: error:" "$log")
  n=$(printf '%s\n' "$lines" | grep -c .)
  distinct=$(printf '%s\n' "$lines" | grep . | sort -u | wc -l)
  if [ "$rc" -eq 0 ]; then
    fail "$name: exited 0, expected an error"; ok=0
  elif [ "$rc" -eq 124 ]; then
    fail "$name: still running after 120 s"; ok=0
  fi
  if grep -q " iteration " "$log"; then fail "$name: an iteration ran before the error"; ok=0; fi
  if [ "$n" -lt 1 ] || [ "$n" -gt "$np" ] || [ "$distinct" -ne 1 ]; then
    fail "$name: expected 1 to $np identical 'lattice train: error:' lines, got $n ($distinct distinct)"; ok=0
  fi
  local p rest="$patterns|"
  while [ -n "$rest" ]; do
    p=${rest%%|*}
    rest=${rest#*|}
    [ -z "$p" ] && continue
    # (a here-string: under pipefail, `printf | grep -q` fails when grep's early exit kills printf by SIGPIPE)
    if ! grep -qiF -- "$p" <<<"$lines"; then fail "$name: the error does not mention '$p'"; ok=0; fi
  done
  if [ "$ok" -eq 1 ]; then
    pass "$name: $(printf '%s\n' "$lines" | head -n 1) ($n rank(s), exit $rc)"
  else
    echo "  exit status: $rc" >&2
    sed 's/^/    /' "$log" >&2
  fi
}

# (a) heads not divisible by TP (2 ranks: TP = 2 fits the world, the model does not).
mpi_error "heads not divisible by TP" 2 \
  "--num-attention-heads 3|not divisible|--tensor-model-parallel-size 2" -- \
  train --hidden-size 48 --num-attention-heads 3 --seq-length 16 "${REST[@]}" --tensor-model-parallel-size 2
# (b) FFN width not divisible by TP.
mpi_error "ffn-hidden-size not divisible by TP" 2 \
  "--ffn-hidden-size 33|not divisible|--tensor-model-parallel-size 2" -- \
  train --hidden-size 32 --num-attention-heads 2 --ffn-hidden-size 33 --seq-length 16 "${REST[@]}" \
  --tensor-model-parallel-size 2
# (c) --sequence-parallel with a sequence length not divisible by TP: refused with the
# flags, before any process group is made (so one process shows it too).
expect_error "seq-length not divisible by TP with --sequence-parallel" \
  "--seq-length 15|not divisible|--tensor-model-parallel-size 2|--sequence-parallel" -- \
  "$LATTICE" train --hidden-size 32 --num-attention-heads 2 --seq-length 15 "${REST[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel
mpi_error "seq-length not divisible by TP with --sequence-parallel (mpirun)" 2 \
  "--seq-length 15|not divisible|--tensor-model-parallel-size 2|--sequence-parallel" -- \
  train --hidden-size 32 --num-attention-heads 2 --seq-length 15 "${REST[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel
# (d) world size not divisible by TP x PP.
mpi_error "world size not divisible by TP x PP" 3 \
  "world size 3|not divisible|--tensor-model-parallel-size 2|--pipeline-model-parallel-size 1" -- \
  train --hidden-size 32 --num-attention-heads 2 --seq-length 16 "${REST[@]}" --tensor-model-parallel-size 2
# (e) TP = 2 in one process (no mpirun): the world is 1.
expect_error "TP 2 without mpirun" "world size 1|--tensor-model-parallel-size 2|mpirun" -- \
  "$LATTICE" train --hidden-size 32 --num-attention-heads 2 --seq-length 16 "${REST[@]}" \
  --tensor-model-parallel-size 2
# A bad value of the flag itself.
expect_error "TP 0" "--tensor-model-parallel-size|0" -- \
  "$LATTICE" train --hidden-size 32 --num-attention-heads 2 --seq-length 16 "${REST[@]}" \
  --tensor-model-parallel-size 0

# The layouts these cases break do train once fixed (the errors come from the layout, not
# from the rest of the command line): TP = 2 with --sequence-parallel on 2 ranks.
rc=0
"${MPIRUN[@]}" -np 2 "$LATTICE" train --hidden-size 48 --num-attention-heads 4 --seq-length 16 "${REST[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel >"$TMP/good.log" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] && grep -q " iteration  *2/" "$TMP/good.log"; then
  pass "TP 2 + --sequence-parallel on 2 ranks trains"
else
  fail "TP 2 + --sequence-parallel on 2 ranks: exit $rc, output: $(tail -5 "$TMP/good.log")"
fi
e2e_finish
