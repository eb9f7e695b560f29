#!/usr/bin/env bash
# Crash consistency: the trainer saves every iteration and is SIGKILLed at random moments
# (most land inside a save: a tiny model spends its time writing checkpoints). After every
# kill the latest complete checkpoint must load and training resume from it; at the end,
# the run that was killed over and over must hold exactly the parameters, optimizer state
# and metrics of a run that never was.
#   bash tests/e2e/test_checkpoint_crash.sh <path to lattice binary> <source dir> [trials]
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1
# Debian's interpreter: a python3 shim first on PATH can take a second to start.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
TRIALS=${3:-24}
SEED=${CRASH_SEED:-$$}  # reproducible kill times with CRASH_SEED=...
RANDOM=$SEED
echo "crash test: $TRIALS trials, CRASH_SEED=$SEED"

ARGS=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 100000
      --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 3 --lr-decay-style cosine
      --hidden-dropout 0.1 --attention-dropout 0.1 --log-interval 1 --seed 7 --peak-tflops 1 --num-threads 1
      --mock-data --vocab-size 64)

tracker() { cat ck/latest_checkpointed_iteration.txt 2>/dev/null || echo none; }

start=$(date +%s)
mid_save=0
bad=0
for t in $(seq 1 "$TRIALS"); do
  before=$(tracker)
  "$LATTICE" train "${ARGS[@]}" --load ck --save ck --save-interval 1 --metrics-file m.jsonl \
    >"run$t.out" 2>"run$t.err" &
  pid=$!
  # The run must first load the checkpoint the tracker names (or start from scratch).
  if [ "$before" = none ]; then want='no checkpoint'; else want="loaded checkpoint .*iteration $before[,) ]"; fi
  if ! wait_for "run$t.out" "$want"; then
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    fail "trial $t: the run did not load the latest checkpoint (iteration $before)"
    sed 's/^/    /' "run$t.out" "run$t.err" | tail -n 5 >&2
    bad=1
    break
  fi
  # ... then a few saves, killed at a random moment (0-150 ms).
  sleep "0.$(printf '%03d' $((RANDOM % 150)))"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null
  compgen -G "ck/.tmp.iter_*" >/dev/null && mid_save=$((mid_save + 1))
done
after=$(tracker)
[ "$bad" -eq 0 ] && pass "$TRIALS SIGKILLs: every restart loaded the latest checkpoint ($mid_save killed mid-save, reached iteration $after)"

# Resume once more to a fixed stop and compare with an uninterrupted run.
if [ "$bad" -eq 0 ] && [[ "$after" =~ ^[0-9]+$ ]]; then
  stop=$((after + 2))
  "$LATTICE" train "${ARGS[@]}" --load ck --save ck --save-interval 1 --exit-interval "$stop" \
    --metrics-file m.jsonl >final.out 2>final.err || fail "the final resume failed: $(tail -n 1 final.err)"
  "$LATTICE" train "${ARGS[@]}" --save ref --exit-interval "$stop" --metrics-file ref.jsonl \
    >ref.out 2>ref.err || fail "the reference run failed: $(tail -n 1 ref.err)"
  it=$(printf 'iter_%07d' "$stop")
  for f in model.safetensors optimizer.safetensors; do
    if [ -s "ref/$it/$f" ] && cmp -s "ck/$it/$f" "ref/$it/$f"; then
      pass "after $TRIALS kills, $it/$f is identical to an uninterrupted run's"
    else
      fail "after $TRIALS kills, $it/$f differs from an uninterrupted run's"
    fi
  done
  fields() { "$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["iteration"], r["consumed_samples"], repr(r["lm_loss"]), repr(r["learning_rate"]))
' "$1"; }
  if [ "$(fields m.jsonl)" = "$(fields ref.jsonl)" ]; then
    pass "the metrics file continues seamlessly across the kills ($(line_count m.jsonl) lines)"
  else
    fail "the metrics file across kills differs from the uninterrupted run's"
    diff <(fields ref.jsonl) <(fields m.jsonl) | head -n 5 | sed 's/^/    /' >&2
  fi
fi
echo "crash test took $(($(date +%s) - start)) s"
e2e_finish
