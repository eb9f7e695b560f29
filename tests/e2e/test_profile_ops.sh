#!/usr/bin/env bash
# lattice train --profile-ops: after the warm-up iteration every kernel call is timed, and the
# log ends with the table (op, calls and ms per iteration, % of the op time, longest first) and
# the op time per iteration against the measured one. Without the flag there is no table.
# --profile (Megatron's): the same table over --profile-step-start/--profile-step-end's
# iterations, logged by each rank of --profile-ranks.
#   bash tests/e2e/test_profile_ops.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)

# 1 layer, 2 micro-batches per iteration; --train-iters 4 below: 3 iterations profiled.
TINY=(train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4
      --lr 1e-3 --log-interval 1 --eval-iters 0 --peak-tflops 1 --mock-data --vocab-size 64)

if ! "$LATTICE" "${TINY[@]}" --train-iters 4 --profile-ops >profile.out 2>profile.err; then
  fail "--profile-ops run exited non-zero: $(tail -n 3 profile.err)"
  e2e_finish
fi

grep -qF '> op profile (--profile-ops) over 3 iterations after the first, wall time of each kernel call on the host:' \
  profile.out && pass "table heading: 3 iterations after the warm-up" || fail "no table heading in the log"
# The table's rows: between the heading and the summary line.
sed -n '/^> op profile/,/^> op time per iteration/p' profile.out | sed '1,2d;$d' >rows.txt
[ -s rows.txt ] || fail "the table has no rows"

# calls/iter of an op ("" when it has no row).
calls() { awk -v op="$1" '$1 == op { print $2 }' rows.txt; }
# Per iteration: 2 micro-batches x (2 LayerNorms in the layer + the final one); the
# LayerNorms after a bias-dropout-add run with it (bias_dropout_add_layernorm_forward).
[ "$(calls layernorm_forward)" = "2.0" ] && pass "layernorm_forward: 2.0 calls per iteration (the first LN1)" ||
  fail "layernorm_forward calls/iter '$(calls layernorm_forward)', expected 2.0"
[ "$(calls bias_dropout_add_layernorm_forward)" = "4.0" ] &&
  pass "bias_dropout_add_layernorm_forward: 4.0 calls per iteration (LN2, the final one)" ||
  fail "bias_dropout_add_layernorm_forward calls/iter '$(calls bias_dropout_add_layernorm_forward)', expected 4.0"
[ "$(calls layernorm_backward)" = "6.0" ] && pass "layernorm_backward: 6.0 calls per iteration" ||
  fail "layernorm_backward calls/iter '$(calls layernorm_backward)', expected 6.0"
gemm=$(calls gemm_f32)
[ "$gemm" = "30.0" ] && pass "gemm_f32: $gemm calls per iteration" ||
  fail "gemm_f32 calls/iter '$gemm', expected 30.0 (2 micro-batches x 5 GEMMs forward, 10 backward)"
# The optimizer: one AdamW call over every parameter's range.
[ "$(calls adamw_update_ranges)" = "1.0" ] && pass "adamw_update_ranges: 1.0 call per iteration" ||
  fail "adamw_update_ranges calls/iter '$(calls adamw_update_ranges)', expected 1.0"

# Sorted by time, the shares add up to 100%, and the total matches the rows.
if awk '{ ms = $3; pct = $4; sub(/%/, "", pct)
          if (NR > 1 && ms > prev + 1e-9) bad = "not sorted at " $1
          prev = ms; sum += pct; total += ms }
        END { if (bad != "") { print bad; exit 1 }
              if (sum < 99.5 || sum > 100.5) { print "shares add up to " sum "%"; exit 1 }
              printf "%.3f\n", total > "total_ms.txt" }' rows.txt >check.txt; then
  pass "rows sorted by ms/iter, shares add up to 100%"
else
  fail "table: $(cat check.txt)"
fi
summary=$(grep '^> op time per iteration' profile.out)
if [ -z "$summary" ]; then
  fail "no '> op time per iteration' line"
else
  # "> op time per iteration A ms of B ms measured (P%); outside the ops (...): R ms"
  read -r op measured rest_ms < <(echo "$summary" |
    sed -n 's/^> op time per iteration \([0-9.]*\) ms of \([0-9.]*\) ms measured.*: \(-\?[0-9.]*\) ms$/\1 \2 \3/p')
  if [ -z "${op:-}" ]; then
    fail "summary line not in the expected form: $summary"
  elif awk -v o="$op" -v m="$measured" -v r="$rest_ms" -v t="$(cat total_ms.txt)" \
         'BEGIN { d = o - t; if (d < 0) d = -d; e = m - o - r; if (e < 0) e = -e
                  exit !(o > 0 && o <= m && d < 0.01 + 0.001 * o && e < 0.002) }'; then
    pass "op time $op ms of $measured ms per iteration (rest $rest_ms ms)"
  else
    fail "summary inconsistent with the rows ($(cat total_ms.txt) ms) or the measured time: $summary"
  fi
fi

# Without the flag: no table; one iteration cannot be profiled.
if "$LATTICE" "${TINY[@]}" --train-iters 4 >plain.out 2>plain.err; then
  grep -q '^> op profile\|^> op time' plain.out && fail "a table without --profile-ops" ||
    pass "no table without --profile-ops"
else
  fail "run without --profile-ops exited non-zero"
fi
expect_error "one iteration" "--profile-ops|2 or more iterations" -- \
  "$LATTICE" "${TINY[@]}" --profile-ops --train-iters 1

# Megatron's --profile window: the steps after 1 to 2 iterations done (iterations 2 and 3) of 4,
# the same table as --profile-ops (the same rows per iteration), logged by rank 0 (the default).
if "$LATTICE" "${TINY[@]}" --train-iters 4 --profile --profile-step-start 1 --profile-step-end 3 >window.out \
  2>window.err; then
  grep -qF '> op profile (--profile) of rank 0 over iterations 2 to 3, wall time of each kernel call on the host:' \
    window.out && pass "--profile: iterations 2 to 3 on rank 0" || fail "--profile: no heading for iterations 2 to 3"
  sed -n '/^> op profile/,/^> op time per iteration/p' window.out | sed '1,2d;$d' >rows.txt
  [ "$(calls gemm_f32)" = "30.0" ] && pass "--profile: gemm_f32 30.0 calls per iteration" ||
    fail "--profile: gemm_f32 calls/iter '$(calls gemm_f32)', expected 30.0"
else
  fail "--profile run exited non-zero: $(tail -n 3 window.err)"
fi
# A window past the run: said so, not silently nothing.
if "$LATTICE" "${TINY[@]}" --train-iters 4 --profile >late.out 2>late.err; then
  grep -qF '> op profile (--profile) of rank 0: no iteration profiled (--profile-step-start 10 and --profile-step-end 12 select iterations 11 to 12, which this run did not train)' \
    late.out && pass "--profile past the run: no iteration profiled, said" || fail "--profile past the run: $(grep 'op profile' late.out)"
else
  fail "--profile past the run exited non-zero: $(tail -n 3 late.err)"
fi
# Two processes, --profile-ranks 1: rank 1 logs its table (rank 0's log has none of its own).
if "${MPIRUN[@]}" -np 2 "$LATTICE" "${TINY[@]}" --train-iters 3 --profile --profile-step-start 1 --profile-step-end 3 \
  --profile-ranks 1 >ranks.out 2>ranks.err; then
  [ "$(grep -c '^> op profile' ranks.out)" = 1 ] &&
    grep -qF '> op profile (--profile) of rank 1 over iterations 2 to 3,' ranks.out &&
    pass "--profile-ranks 1 under 2 processes: rank 1's table only" ||
    fail "--profile-ranks 1: $(grep '^> op profile' ranks.out)"
else
  fail "--profile-ranks 1 under mpirun exited non-zero: $(tail -n 3 ranks.err)"
fi
expect_error "--profile-ranks past the world" "--profile-ranks 1|no such rank (1 in all)" -- \
  "$LATTICE" "${TINY[@]}" --train-iters 3 --profile --profile-ranks 1
expect_error "--use-pytorch-profiler" "--use-pytorch-profiler|no PyTorch profiler" -- \
  "$LATTICE" "${TINY[@]}" --train-iters 3 --profile --use-pytorch-profiler
e2e_finish
