#!/usr/bin/env bash
# bench/gpu_bench.sh (the GPU benchmark of scripts/gpu-check.sh) without a GPU: its lattice runs
# through the CUDA emulation (LATTICE_EMULATE_CUDA=1) on the tiny shape, so a borrowed GPU's
# short window is not spent on a broken script. Checks a row per micro-batch size whose numbers
# are those of the run's metrics file, the four --profile-ops tables (two hybrids' too), and
# that a failed run is reported in its row with a non-zero exit.
#   bash tests/e2e/test_gpu_bench.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

bench() {  # LOGDIR SUMMARY [VAR=value...]: the benchmark on the tiny shape, B = 1 and 3, T = 32
  local logdir=$1 summary=$2
  shift 2
  env LATTICE_EMULATE_CUDA=1 LATTICE="$LATTICE" PYTHON=python3 SHAPES=tiny MBS="1 3" SEQ=32 WARMUP=1 \
    STEPS=2 SYSTEMS=lattice HYBRID_SHAPE=tiny LOGDIR="$logdir" "$@" bash "$SRC/bench/gpu_bench.sh" "$summary"
}

rc=0
bench "$TMP/logs" "$TMP/table" > "$TMP/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] && pass "exit status 0" || fail "exit status $rc, expected 0"

# row B: the table's row for micro-batch size B -> "tokens/s TFLOP/s MFU ms"
row() {
  sed -n "s/^tiny  *$1 | \([0-9.]*\)  *\([0-9.]*\)  *\([0-9.]*\)%  *\([0-9.]*\)  *| skipped .*/\1 \2 \3 \4/p" "$TMP/table"
}
for B in 1 3; do
  r=$(row "$B")
  if [ -z "$r" ]; then
    fail "no row for B=$B with numbers"
    continue
  fi
  read -r tps tf mfu ms <<<"$r"
  # The row's time is the mean over the timed iterations (after the warm-up) of the run's own
  # metrics file, and its tokens/s is B x T per that time.
  want=$(python3 - "$TMP/logs/tiny.b$B.lattice.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ms = [r["elapsed_ms"] for r in rows if "elapsed_ms" in r and r["iteration"] > 1]
print(len(ms), sum(ms) / len(ms))
PY
  ) || { fail "B=$B: no metrics file"; continue; }
  read -r n want_ms <<<"$want"
  [ "$n" -eq 2 ] && pass "B=$B: 2 timed iterations in the metrics file" || fail "B=$B: $n timed iterations, expected 2"
  awk -v a="$ms" -v b="$want_ms" 'BEGIN { exit !(a - b < 0.051 && b - a < 0.051) }' &&
    pass "B=$B: $ms ms/iter, the metrics file's mean" || fail "B=$B: $ms ms/iter, the metrics file says $want_ms"
  awk -v t="$tps" -v b="$B" -v ms="$ms" 'BEGIN { w = b * 32 * 1000 / ms; exit !(t - w < 1 + 1e-3 * w && w - t < 1 + 1e-3 * w) }' &&
    pass "B=$B: $tps tokens/s = B x T / time" || fail "B=$B: $tps tokens/s, not $B x 32 per $ms ms"
  # The run trained B samples per iteration.
  step=$(python3 -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(*sorted({b["consumed_samples"] - a["consumed_samples"] for a, b in zip(r, r[1:])} | {r[0]["consumed_samples"]}))' \
    "$TMP/logs/tiny.b$B.lattice.jsonl")
  [ "$step" = "$B" ] && pass "B=$B: $B samples per iteration" || fail "B=$B: consumed samples grow by '$step' per iteration"
done
grep -q "^shape  *B | lattice --device cuda --bf16" "$TMP/table" && pass "table header" || fail "no table header"

# The per-op tables of the first shape and B, with the tensor-core and the fp32 attention.
for attn in auto fp32; do
  sed -n "/^Where lattice's time goes, tiny B=1: LATTICE_CUDA_ATTENTION=$attn/,/op time per iteration/p" "$TMP/table" \
    > "$TMP/profile-$attn"
  grep -q "^> op time per iteration" "$TMP/profile-$attn" && grep -q "attention_forward" "$TMP/profile-$attn" &&
    pass "profile table, attention $attn" || fail "no profile table for attention $attn"
done
# The hybrids' tables, with their recurrent layers' kernels.
for kind in "Mamba hybrid:mamba_scan" "Gated DeltaNet hybrid:gdn_delta_rule"; do
  name=${kind%%:*} op=${kind#*:}
  sed -n "/^Where a hybrid's time goes, $name .*T=32, B=1/,/op time per iteration/p" "$TMP/table" > "$TMP/profile-hybrid"
  grep -q "^> op time per iteration" "$TMP/profile-hybrid" && grep -q "${op}_forward" "$TMP/profile-hybrid" &&
    grep -q "${op}_backward" "$TMP/profile-hybrid" && pass "profile table, $name" || fail "no profile table for the $name"
done
[ "$FAILURES" -eq 0 ] || sed 's/^/    /' "$TMP/table" >&2

# A run that fails is reported in its row, with the end of its log, and the exit status says so.
rc=0
bench "$TMP/logs-bad" "$TMP/table-bad" LATTICE=/bin/false PROFILE=0 > "$TMP/out-bad" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && pass "a failed run: exit status 1" || fail "a failed run: exit status $rc, expected 1"
[ "$(grep -c '^tiny  *[13] | FAILED(exit-1)' "$TMP/table-bad")" -eq 2 ] &&
  pass "a failed run: FAILED(exit-1) in both rows" || fail "a failed run is not in its rows"
grep -q "gpu_bench: lattice tiny B=3 failed (exit 1)" "$TMP/out-bad" && pass "a failed run: named on stderr" ||
  fail "a failed run is not named on stderr"

# An unknown shape is an error, not a skipped row.
rc=0
bench "$TMP/logs-shape" "$TMP/table-shape" SHAPES=huge PROFILE=0 > "$TMP/out-shape" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "unknown shape 'huge'" "$TMP/out-shape" && pass "unknown shape: error" ||
  fail "unknown shape: exit $rc, $(cat "$TMP/out-shape")"
e2e_finish
