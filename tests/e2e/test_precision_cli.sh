#!/usr/bin/env bash
# Mixed precision through the CLI: flag errors, --bf16 / --fp8-format runs (evaluations leave
# fp8's scaling alone), and --fp16's
# loss scaler with induced overflows (the LATTICE_TEST_INJECT_INF_ITERS test hook): the
# steps are skipped and counted in the log, the scale backs off per the hysteresis rule,
# the LR scheduler is not stepped on them, and training continues.
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

small=(train --mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --log-interval 1 --eval-iters 0
       --lr 1e-3 --lr-warmup-iters 4 --lr-decay-iters 100 --peak-tflops 1)

expect_error "bf16 with fp16" "--bf16|--fp16|exclusive" -- "$LATTICE" "${small[@]}" --train-iters 2 --bf16 --fp16
expect_error "fp8 format" "--fp8-format|e5m2" -- "$LATTICE" "${small[@]}" --train-iters 2 --fp8-format e5m2
expect_error "loss scale without fp16" "--loss-scale|--fp16" -- "$LATTICE" "${small[@]}" --train-iters 2 --loss-scale 8
expect_error "fp8 margin without fp8" "--fp8-margin|--fp8-format" -- "$LATTICE" "${small[@]}" --train-iters 2 --fp8-margin 1
expect_error "amax algo" "--fp8-amax-compute-algo|mean" -- \
  "$LATTICE" "${small[@]}" --train-iters 2 --fp8-format hybrid --fp8-amax-compute-algo mean
expect_error "bf16 reduction without bf16" "--grad-reduce-in-bf16|--bf16" -- \
  "$LATTICE" "${small[@]}" --train-iters 2 --grad-reduce-in-bf16
expect_error "bad hook" "LATTICE_TEST_INJECT_INF_ITERS|x" -- \
  env LATTICE_TEST_INJECT_INF_ITERS=x "$LATTICE" "${small[@]}" --train-iters 2 --fp16

run() {  # name, extra args...
  local name=$1
  shift
  if "$LATTICE" "${small[@]}" --metrics-file "$TMP/$name.jsonl" "$@" >"$TMP/$name.out" 2>&1; then
    pass "$name ran"
  else
    fail "$name: exit status $? (log: $(tail -n 3 "$TMP/$name.out"))"
  fi
}
run bf16 --train-iters 3 --bf16
grep -q "precision: bf16" "$TMP/bf16.out" || fail "bf16: no precision line in the log"
# LATTICE_BF16_GEMM picks the CPU's bf16 GEMM path: both paths sum the same exact products in
# fp32, so their losses agree to fp32 accumulation order. onednn needs AVX512-BF16 (as oneDNN
# sees it); without it the run is refused in one line.
expect_error "bf16 GEMM path" "LATTICE_BF16_GEMM=tiles|onednn|fp32" -- \
  env LATTICE_BF16_GEMM=tiles "$LATTICE" "${small[@]}" --train-iters 2 --bf16
LATTICE_BF16_GEMM=fp32 run bf16_fp32path --train-iters 3 --bf16
grep -q "GEMMs: fp32 GEMM on widened bf16 operands" "$TMP/bf16_fp32path.out" ||
  fail "LATTICE_BF16_GEMM=fp32: the log does not name the path ($(grep precision "$TMP/bf16_fp32path.out"))"
if LATTICE_BF16_GEMM=onednn "$LATTICE" "${small[@]}" --train-iters 3 --bf16 \
     --metrics-file "$TMP/bf16_onednn.jsonl" >"$TMP/bf16_onednn.out" 2>&1; then
  grep -q "GEMMs: oneDNN bf16 matmul" "$TMP/bf16_onednn.out" ||
    fail "LATTICE_BF16_GEMM=onednn: the log does not name the path ($(grep precision "$TMP/bf16_onednn.out"))"
  python3 - "$TMP/bf16_fp32path.jsonl" "$TMP/bf16_onednn.jsonl" <<'PY' || fail "bf16 GEMM paths: losses (above)"
import json, sys
a, b = ([json.loads(l)["lm_loss"] for l in open(p) if "lm_loss" in l] for p in sys.argv[1:3])
print("fp32 path", a, "oneDNN path", b)
sys.exit(0 if len(a) == len(b) == 3 and all(abs(x - y) <= 1e-3 * abs(x) for x, y in zip(a, b)) else 1)
PY
  pass "LATTICE_BF16_GEMM: the oneDNN and fp32 paths train to the same losses"
elif grep -q "LATTICE_BF16_GEMM=onednn: this CPU has no AVX512-BF16" "$TMP/bf16_onednn.out"; then
  pass "LATTICE_BF16_GEMM=onednn refused on a CPU without AVX512-BF16"
else
  fail "LATTICE_BF16_GEMM=onednn: exit status without the expected message ($(tail -n 3 "$TMP/bf16_onednn.out"))"
fi
run fp8 --train-iters 3 --bf16 --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max
grep -q "fp8 hybrid" "$TMP/fp8.out" || fail "fp8: no precision line in the log"
# --no-fp8-wgrad: the same first loss (the forward is fp8 either way), then other weights (the weight
# gradients were not quantized); the log says so.
run fp8_wgrad --train-iters 3 --bf16 --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max \
  --no-fp8-wgrad
grep -q "weight gradients unquantized" "$TMP/fp8_wgrad.out" || fail "--no-fp8-wgrad: not in the precision line"
python3 - "$TMP/fp8.jsonl" "$TMP/fp8_wgrad.jsonl" <<'PY' && pass "--no-fp8-wgrad: the same first loss, other updates" ||
import json, sys
a, b = ([json.loads(l)["lm_loss"] for l in open(p) if "lm_loss" in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 3 and a[0] == b[0] and a[2] != b[2], (a, b)
PY
  fail "--no-fp8-wgrad: losses (above)"
expect_error "--no-fp8-wgrad without fp8" "--no-fp8-wgrad needs --fp8-format" -- \
  "$LATTICE" "${small[@]}" --train-iters 2 --no-fp8-wgrad
# The current-scaling recipes (tensorwise, blockwise, mxfp8): the log names the recipe, the losses
# track fp32's, and since nothing is carried between GEMMs, full recomputation (refused with the
# delayed recipe) trains to the same losses bit for bit.
run fp32ref --train-iters 3
for recipe in tensorwise blockwise mxfp8; do
  run "fp8_$recipe" --train-iters 3 --bf16 --fp8-format hybrid --fp8-recipe "$recipe"
  grep -q "fp8 hybrid linear layers ($recipe scaling; the output layer in bf16)" "$TMP/fp8_$recipe.out" ||
    fail "--fp8-recipe $recipe: not in the precision line ($(grep precision "$TMP/fp8_$recipe.out"))"
  run "fp8_${recipe}_recompute" --train-iters 3 --bf16 --fp8-format hybrid --fp8-recipe "$recipe" \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  python3 - "$TMP/fp32ref.jsonl" "$TMP/fp8_$recipe.jsonl" "$TMP/fp8_${recipe}_recompute.jsonl" <<'PY' &&
import json, sys
ref, a, b = ([json.loads(l)["lm_loss"] for l in open(p) if "lm_loss" in l] for p in sys.argv[1:4])
print(sys.argv[2], a, "fp32", ref)
assert len(a) == len(b) == len(ref) == 3, (a, b, ref)
assert a == b, ("recomputed", b)
assert all(abs(x - r) <= 0.02 * r for x, r in zip(a, ref)), "more than 2% from fp32"
PY
    pass "--fp8-recipe $recipe: within 2% of fp32; full recomputation bit-identical" ||
    fail "--fp8-recipe $recipe: losses (above)"
done
# --first-last-layers-bf16 (the current-scaling recipes): with both of the model's layers out of fp8
# (and the output layer, never fp8) every GEMM is bf16: the run is --bf16's but for the rounding of
# the GEMM results (fp8 runs keep them fp32), closer to it than the fp8 run. The log says which.
run fp8_first_last --train-iters 3 --bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16
grep -q "the output layer and the first 1 and last 1 decoder layers in bf16" "$TMP/fp8_first_last.out" ||
  fail "--first-last-layers-bf16: not in the precision line ($(grep precision "$TMP/fp8_first_last.out"))"
python3 - "$TMP/bf16.jsonl" "$TMP/fp8_tensorwise.jsonl" "$TMP/fp8_first_last.jsonl" <<'PY' &&
import json, sys
bf16, fp8, first_last = ([json.loads(l)["lm_loss"] for l in open(p) if "lm_loss" in l][0] for p in sys.argv[1:4])
print("first losses: bf16", bf16, "fp8 tensorwise", fp8, "all layers bf16", first_last)
assert abs(first_last - bf16) < abs(fp8 - bf16) and abs(first_last - bf16) < 2e-4 * bf16
PY
  pass "--first-last-layers-bf16: every layer out of fp8 tracks --bf16" || fail "--first-last-layers-bf16 (above)"
expect_error "fp8 recipe custom" "--fp8-recipe custom builds its quantizers with --fp8-quantizer-factory" -- \
  "$LATTICE" "${small[@]}" --train-iters 2 --fp8-format hybrid --fp8-recipe custom
expect_error "full recomputation with delayed fp8" "--recompute-granularity full is not supported with --fp8-recipe delayed" -- \
  "$LATTICE" "${small[@]}" --train-iters 2 --fp8-format hybrid --recompute-granularity full --recompute-method uniform
# Evaluations between the steps quantize with the current fp8 scales but note no amax: with an
# evaluation after every iteration, the training losses and gradient norms are those of the
# run without, bit for bit (the evaluations' amaxes used to enter the next step's history).
evaluating=("${small[@]}")
for i in "${!evaluating[@]}"; do [ "${evaluating[$i]}" = --eval-iters ] && evaluating[$((i + 1))]=2; done
run fp8_quiet --train-iters 4 --bf16 --fp8-format hybrid
if "$LATTICE" "${evaluating[@]}" --eval-interval 1 --train-iters 4 --bf16 --fp8-format hybrid \
     --metrics-file "$TMP/fp8_eval.jsonl" >"$TMP/fp8_eval.out" 2>&1; then
  if python3 - "$TMP/fp8_quiet.jsonl" "$TMP/fp8_eval.jsonl" <<'PY'; then
import json, sys
a, b = ([(r["lm_loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "lm_loss" in r] for p in sys.argv[1:3])
evals = sum(1 for l in open(sys.argv[2]) if "val_loss" in l)
print("without evaluations", a, "with", b, "evaluations", evals)
sys.exit(0 if len(a) == 4 and a == b and evals >= 4 else 1)
PY
    pass "fp8: evaluating after every iteration leaves the training run unchanged"
  else
    fail "fp8: evaluations changed the training run (above)"
  fi
else
  fail "fp8 with evaluations: exit status $? (log: $(tail -n 3 "$TMP/fp8_eval.out"))"
fi
# --grad-reduce-in-bf16 on 2 data-parallel ranks with the distributed optimizer: runs, and its
# loss stays within bf16 rounding of the fp32-reduced run.
for mode in fp32reduce bf16reduce; do
  extra=()
  [ "$mode" = bf16reduce ] && extra=(--grad-reduce-in-bf16)
  if mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" "${small[@]}" --train-iters 4 --bf16 \
      --use-distributed-optimizer --metrics-file "$TMP/$mode.jsonl" "${extra[@]}" >"$TMP/$mode.out" 2>&1; then
    pass "$mode ran on 2 ranks"
  else
    fail "$mode on 2 ranks: exit status $? (log: $(tail -n 3 "$TMP/$mode.out"))"
  fi
done
python3 - "$TMP/fp32reduce.jsonl" "$TMP/bf16reduce.jsonl" <<'PY' || fail "grad-reduce-in-bf16: losses (above)"
import json, sys
a, b = ([json.loads(l)["lm_loss"] for l in open(p) if "lm_loss" in l] for p in sys.argv[1:3])
print("fp32-reduced", a, "bf16-reduced", b)
sys.exit(0 if len(a) == len(b) == 4 and all(abs(x - y) <= 1e-2 * abs(x) for x, y in zip(a, b)) else 1)
PY
# fp8's scaling state is saved and resumed, here across two pipeline stages (each holds its
# own weights' state; the checkpoint gathers both): 4 iterations straight equal 2 + resume + 2.
fp8pp=(--bf16 --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max
       --pipeline-model-parallel-size 2)
MPI2=(mpirun --allow-run-as-root --oversubscribe -np 2)
if "${MPI2[@]}" "$LATTICE" "${small[@]}" "${fp8pp[@]}" --train-iters 4 --save-interval 2 --save "$TMP/fp8ckpt" \
     --metrics-file "$TMP/fp8_straight.jsonl" >"$TMP/fp8_straight.out" 2>&1 &&
   "${MPI2[@]}" "$LATTICE" "${small[@]}" "${fp8pp[@]}" --train-iters 4 --load "$TMP/fp8ckpt/iter_0000002" \
     --metrics-file "$TMP/fp8_resumed.jsonl" >"$TMP/fp8_resumed.out" 2>&1; then
  pass "fp8 with PP 2: the straight run (saving at 2) and the run resumed from iteration 2 ran"
  grep -q '"decoder.layers.1.mlp.linear_fc2.weight"' "$TMP"/fp8ckpt/iter_0000002/checkpoint.json ||
    fail "fp8: no scaling state of the second stage's layer in checkpoint.json"
  python3 - "$TMP/fp8_straight.jsonl" "$TMP/fp8_resumed.jsonl" <<'PY' || fail "fp8 resume: losses differ (above)"
import json, sys
a = {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(sys.argv[1])) if "lm_loss" in r}
b = {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(sys.argv[2])) if "lm_loss" in r}
print("straight", a, "resumed", b)
sys.exit(0 if b and all(a[i] == b[i] for i in b) and set(b) == {3, 4} else 1)
PY
else
  fail "fp8 with PP 2: a run failed ($(tail -n 3 "$TMP"/fp8_*.out))"
fi
run clean --train-iters 6 --fp16 --initial-loss-scale 1024
LATTICE_TEST_INJECT_INF_ITERS=1,2 run overflow --train-iters 6 --fp16 --initial-loss-scale 1024 --hysteresis 2
grep -q "number of skipped iterations:   1" "$TMP/overflow.out" || fail "overflow: no skipped iteration in the log line"

# iteration: (skipped, loss scale after the step); and the LR of iteration i equals the clean
# run's at i - (skipped so far).
python3 - "$TMP/overflow.jsonl" "$TMP/clean.jsonl" <<'PY' || fail "overflow: metrics differ from the expected (above)"
import json, math, sys
over = {r["iteration"]: r for r in map(json.loads, open(sys.argv[1]))}
clean = {r["iteration"]: r for r in map(json.loads, open(sys.argv[2]))}
want = {1: (0, 1024), 2: (1, 1024), 3: (1, 512), 4: (0, 512), 5: (0, 512), 6: (0, 512)}
bad = 0
skipped = 0
for it, (sk, scale) in want.items():
    r = over[it]
    skipped += sk
    got = (r["skipped_iterations"], r["loss_scale"])
    if got != (sk, scale):
        print(f"iteration {it}: (skipped, loss scale) {got}, want {(sk, scale)}"); bad += 1
    ref = clean[it - skipped] if it - skipped >= 1 else None
    if ref and r["learning_rate"] != ref["learning_rate"]:
        print(f"iteration {it}: lr {r['learning_rate']}, want the clean run's at {it - skipped}: {ref['learning_rate']}"); bad += 1
    if not sk and not math.isfinite(r["lm_loss"]):
        print(f"iteration {it}: loss {r['lm_loss']}"); bad += 1
if any(r["skipped_iterations"] or r["loss_scale"] != 1024 for r in clean.values()):
    print("the clean fp16 run skipped or changed its scale"); bad += 1
sys.exit(1 if bad else 0)
PY

e2e_finish
