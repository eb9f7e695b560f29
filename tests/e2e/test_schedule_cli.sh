#!/usr/bin/env bash
# lattice schedule as a user runs it: the worked examples of reference/megatron.md, the CSV
# layout, --plot, errors, and agreement with the learning rate `lattice train` logs.
#   bash tests/e2e/test_schedule_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

# The model and data flags train needs (schedule takes the same command line).
MODEL=(--num-layers 1 --hidden-size 8 --num-attention-heads 1 --seq-length 4 --micro-batch-size 1
       --mock-data --vocab-size 16)
# megatron.md: GBS 256, lr 3e-4, min 3e-5, warmup 100 iters, decay 10000 iters.
EXAMPLE=(--global-batch-size 256 --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters 100 --lr-decay-iters 10000
         --train-iters 10000)

# field ITER FILE COLUMN: a CSV field of the row of iteration ITER.
field() { awk -F, -v it="$1" -v col="$3" '$1 == it { print $col }' "$2"; }

# example NAME COLUMN ITER PRINTED REFERENCE FLAGS...: the printed value is exactly PRINTED
# (Megatron's double, shortest round trip) and equals megatron.md's REFERENCE to its last digit.
example() {
  local name=$1 col=$2 it=$3 printed=$4 ref=$5
  shift 5
  if ! "$LATTICE" schedule "${MODEL[@]}" "${EXAMPLE[@]}" "$@" >"$name.csv" 2>"$name.err"; then
    fail "$name: lattice schedule exited non-zero: $(cat "$name.err")"
    return
  fi
  local got
  got=$(field "$it" "$name.csv" "$col")
  [ "$got" = "$printed" ] || { fail "$name: iteration $it prints '$got', expected '$printed'"; return; }
  # Significant digits of the reference, then both rounded to that many.
  local digits
  digits=$(echo "${ref%%[eE]*}" | tr -d '.-' | sed 's/^0*//' | tr -d '\n' | wc -c)
  local a b
  a=$(awk -v v="$got" -v d="$digits" 'BEGIN { printf "%.*e", d - 1, v }')
  b=$(awk -v v="$ref" -v d="$digits" 'BEGIN { printf "%.*e", d - 1, v }')
  [ "$a" = "$b" ] || { fail "$name: $got is not megatron.md's $ref to its last digit ($a vs $b)"; return; }
  pass "$name: iteration $it -> $got (megatron.md: $ref)"
}

for style in constant linear cosine inverse-square-root WSD; do
  example "warmup_$style" 3 50 0.00015 1.5e-4 --lr-decay-style "$style" --lr-wsd-decay-iters 2000
done
example cosine 3 5050 0.00016499999999999997 1.65e-4 --lr-decay-style cosine
example linear 3 2575 0.00023249999999999996 2.325e-4 --lr-decay-style linear
example isr_400 3 400 0.00015 1.5e-4 --lr-decay-style inverse-square-root
example isr_2500 3 2500 5.9999999999999995e-05 6e-5 --lr-decay-style inverse-square-root
example wsd 3 8500 0.0002140840642370058 2.140840642370058e-4 --lr-decay-style WSD \
  --lr-wsd-decay-iters 2000 --lr-wsd-decay-style exponential
example constant_init 3 25 8.249999999999999e-05 8.25e-5 --lr-decay-style constant --lr-warmup-init 1e-5
example wd_linear 4 2500 0.025 0.025 --weight-decay-incr-style linear --start-weight-decay 0 \
  --end-weight-decay 0.1
example wd_cosine 4 2500 0.014644660940672627 0.014644660940672627 --weight-decay-incr-style cosine \
  --start-weight-decay 0 --end-weight-decay 0.1

# ---- CSV layout: header, iterations 0..train-iters, consumed_samples = iteration x GBS ----
if "$LATTICE" schedule "${MODEL[@]}" --global-batch-size 6 --train-iters 50 --lr 1e-3 \
     --lr-warmup-iters 5 --lr-decay-style cosine --decoupled-lr 2e-3 >layout.csv 2>layout.err; then
  [ "$(head -n 1 layout.csv)" = "iteration,consumed_samples,lr,weight_decay,decoupled_lr" ] ||
    fail "layout: header is '$(head -n 1 layout.csv)'"
  [ "$(line_count layout.csv)" -eq 52 ] || fail "layout: $(line_count layout.csv) lines, expected 52"
  awk -F, 'NR > 1 && ($1 != NR - 2 || $2 != $1 * 6 || NF != 5) { bad = 1 } END { exit bad }' layout.csv ||
    fail "layout: rows are not iteration 0..50 with consumed_samples = iteration x 6"
  [ "$(field 0 layout.csv 3)" = "0" ] && [ "$(field 5 layout.csv 3)" = "0.001" ] &&
    [ "$(field 5 layout.csv 5)" = "0.002" ] && [ "$(field 50 layout.csv 3)" = "0" ] ||
    fail "layout: warmup start/peak/end values are wrong"
  [ -s layout.err ] && fail "layout: stderr is not empty without --plot"
  pass "CSV: header, one row per iteration 0..train-iters, decoupled lr column"
else
  fail "layout: lattice schedule exited non-zero: $(cat layout.err)"
fi

# ---- --plot ----
if "$LATTICE" schedule "${MODEL[@]}" "${EXAMPLE[@]}" --lr-decay-style WSD --lr-wsd-decay-iters 2000 \
     --plot curve.svg >plot.csv 2>plot.err; then
  [ -s curve.svg ] || fail "--plot: curve.svg not written"
  grep -q '^<svg' curve.svg && grep -q '</svg>' curve.svg || fail "--plot: curve.svg is not an SVG document"
  grep -q '<polyline class="lr"' curve.svg || fail "--plot: no learning-rate curve"
  grep -q '<polyline class="weight_decay"' curve.svg || fail "--plot: no weight-decay curve"
  [ "$(line_count plot.csv)" -eq 10002 ] || fail "--plot: the CSV still goes to stdout"
  [ -e curve.svg.tmp ] && fail "--plot: left curve.svg.tmp behind"
  pass "--plot writes the SVG chart and still prints the CSV"
else
  fail "--plot: exited non-zero: $(cat plot.err)"
fi
echo "old" >keep.svg
chmod a-w .
if [ -w . ]; then
  chmod u+w .  # root ignores permissions: skip the unwritable-directory case
else
  expect_error plot_unwritable "keep.svg|cannot write" -- "$LATTICE" schedule "${MODEL[@]}" \
    --train-iters 3 --plot keep.svg
  chmod u+w .
  [ "$(cat keep.svg)" = "old" ] || fail "plot_unwritable: keep.svg was changed"
fi
expect_error plot_missing_dir "no/such/dir.svg|cannot write" -- "$LATTICE" schedule "${MODEL[@]}" \
  --train-iters 3 --plot no/such/dir.svg

# ---- errors: one line naming the flag ----
expect_error wsd_needs_iters "--lr-decay-style WSD|--lr-wsd-decay-iters" -- \
  "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --lr-decay-style WSD
expect_error lr_below_min "--lr|--min-lr" -- \
  "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --lr 1e-5 --min-lr 1e-4
expect_error warmup_exclusive "--lr-warmup-fraction|--lr-warmup-iters|exclusive" -- \
  "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --lr 1e-3 --lr-warmup-fraction 0.1 --lr-warmup-iters 2
expect_error warmup_too_long "warmup|shorter than the decay" -- \
  "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --lr 1e-3 --lr-warmup-iters 10
expect_error bad_style "--lr-decay-style|cosinus" -- \
  "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --lr 1e-3 --lr-decay-style cosinus
expect_error wd_style_needs_range "--weight-decay-incr-style linear|--start-weight-decay" -- \
  "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --weight-decay-incr-style linear
expect_error plot_needs_file "--plot" -- "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --plot
expect_error unknown_flag "--lr-decay-stile" -- "$LATTICE" schedule "${MODEL[@]}" --train-iters 10 --lr-decay-stile x
# The same errors stop `lattice train` before it computes anything.
expect_error train_wsd_needs_iters "--lr-wsd-decay-iters" -- \
  "$LATTICE" train "${MODEL[@]}" --train-iters 10 --lr-decay-style WSD --peak-tflops 1

# ---- --help ----
if "$LATTICE" schedule --help >help.out 2>&1; then
  grep -qF -- '--plot' help.out || fail "schedule --help does not mention --plot"
  pass "schedule --help"
else
  fail "schedule --help exited non-zero"
fi

# ---- train logs the schedule's learning rate (after each iteration's step) ----
TRAIN=(--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 2
       --global-batch-size 4 --mock-data --vocab-size 32 --train-iters 6 --lr 1e-3 --min-lr 1e-4
       --lr-warmup-iters 2 --lr-decay-style cosine --log-interval 1 --peak-tflops 1)
if "$LATTICE" train "${TRAIN[@]}" --metrics-file m.jsonl >train.out 2>train.err &&
   "$LATTICE" schedule "${TRAIN[@]}" >train_sched.csv 2>/dev/null; then
  grep -o '"learning_rate":[^,}]*' m.jsonl | cut -d: -f2 >logged.txt
  awk -F, 'NR > 2 { print $3 }' train_sched.csv >expected.txt
  [ "$(line_count logged.txt)" -eq 6 ] || fail "train: $(line_count logged.txt) learning rates in metrics, expected 6"
  paste -d' ' logged.txt expected.txt | awk '$1 != $2 { bad = 1; print "  " $0 } END { exit bad }' ||
    fail "train: metrics learning_rate differs from lattice schedule's lr (iterations 1..6)"
  grep -o 'learning rate: [^ ]*' train.out | cut -d' ' -f3 >logged_e.txt
  awk '{ printf "%.6E\n", $1 }' expected.txt >expected_e.txt
  cmp -s logged_e.txt expected_e.txt || fail "train: log line learning rates differ from lattice schedule"
  pass "train logs the schedule's learning rate after each step"
else
  fail "train/schedule run failed: $(cat train.err)"
fi

e2e_finish
