#!/usr/bin/env bash
# Checkpoint resume through the CLI: 2N iterations straight equal N, stop, resume, N more,
# bit for bit (every logged loss and learning rate, the final parameters and optimizer
# state), with the stop made by --exit-interval and by SIGTERM (--exit-signal-handler);
# and the load options: --finetune, --no-load-optim, --ckpt-step, --pretrained-checkpoint, non-persistent
# checkpoints, the scheduler override flags,
# --keep-last-n, --save-retain-interval, --exit-duration-in-mins, a model mismatch, a missing --load directory.
#   bash tests/e2e/test_checkpoint_resume.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1
# Debian's interpreter: a python3 shim first on PATH can take a second to start.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# Dropout on and a warmup + cosine schedule, so the RNG, the scheduler and the data position
# all matter for the resumed numbers.
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4
      --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 2 --lr-decay-style cosine --lr-decay-iters 40
      --hidden-dropout 0.1 --attention-dropout 0.1 --log-interval 1 --seed 1234 --peak-tflops 1 --num-threads 1
      --mock-data --vocab-size 64)

# The deterministic fields of a metrics file, one line per logged iteration (the evaluation
# lines, without consumed_samples, are left out).
numbers() {
  "$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "consumed_samples" not in r:
        continue
    print(r["iteration"], r["consumed_samples"], repr(r["lm_loss"]), repr(r["learning_rate"]), repr(r["grad_norm"]))
' "$1"
}

# same_state A B: the parameter and optimizer files of two iteration directories are identical.
same_state() {
  local f
  for f in model.safetensors optimizer.safetensors; do
    if [ ! -s "$1/$f" ] || [ ! -s "$2/$f" ]; then
      echo "missing $1/$f or $2/$f"
      return 1
    fi
    cmp -s "$1/$f" "$2/$f" || { echo "$1/$f and $2/$f differ"; return 1; }
  done
}

# ---- straight 6 iterations vs 3 + exit + resume 3 ----
run straight "$LATTICE" train "${BASE[@]}" --train-iters 6 --save straight --metrics-file straight.jsonl
run half1 "$LATTICE" train "${BASE[@]}" --train-iters 6 --save split --save-interval 3 --exit-interval 3 \
  --metrics-file split.jsonl
if [ "$(cat split/latest_checkpointed_iteration.txt 2>/dev/null)" != "3" ] || [ -e split/iter_0000006 ]; then
  fail "--exit-interval 3 did not stop after iteration 3 with a checkpoint"
fi
grep -q 'iteration        4/' half1.out && fail "--exit-interval 3 trained past iteration 3"
run half2 "$LATTICE" train "${BASE[@]}" --train-iters 6 --save split --save-interval 3 --exit-interval 3 \
  --load split --metrics-file split.jsonl
grep -q ' iteration        4/       6 | consumed samples:           16 |' half2.out ||
  fail "the resumed run does not continue at iteration 4 with 16 consumed samples"
grep -q ' iteration        3/' half2.out && fail "the resumed run repeated iteration 3"
if [ -s straight.jsonl ] && [ "$(numbers straight.jsonl)" = "$(numbers split.jsonl)" ]; then
  pass "6 straight == 3 + resume + 3: identical iterations, samples, losses, learning rates, grad norms"
else
  fail "resumed metrics differ from the straight run:"
  diff <(numbers straight.jsonl) <(numbers split.jsonl) | sed 's/^/    /' >&2
fi
if msg=$(same_state straight/iter_0000006 split/iter_0000006); then
  pass "final parameters and optimizer state are bit-identical after a resume"
else
  fail "final state differs after a resume: $msg"
fi

# ---- SIGTERM with --exit-signal-handler: save, exit 0, resume bit-exactly ----
"$LATTICE" train "${BASE[@]}" --train-iters 100000 --exit-signal-handler --save sig \
  --metrics-file sig.jsonl >sig1.out 2>sig1.err &
pid=$!
wait_for sig.jsonl '"iteration":3[,}]' 30
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
k=$(cat sig/latest_checkpointed_iteration.txt 2>/dev/null || echo none)
if [ "$rc" -ne 0 ]; then
  fail "SIGTERM with --exit-signal-handler: exit status $rc, expected 0"
  sed 's/^/    /' sig1.err >&2
elif ! [[ "$k" =~ ^[0-9]+$ ]] || [ "$k" -lt 3 ]; then
  fail "SIGTERM with --exit-signal-handler did not save a checkpoint (tracker: $k)"
elif [ "$(numbers sig.jsonl | tail -n 1 | cut -d' ' -f1)" != "$k" ]; then
  fail "SIGTERM: last logged iteration $(numbers sig.jsonl | tail -n 1 | cut -d' ' -f1) != checkpoint $k"
else
  pass "SIGTERM with --exit-signal-handler saved iteration $k and exited 0"
  e=$((k + 3))
  run sig2 "$LATTICE" train "${BASE[@]}" --train-iters 100000 --exit-signal-handler --save sig --load sig \
    --exit-interval "$e" --metrics-file sig.jsonl
  run sigref "$LATTICE" train "${BASE[@]}" --train-iters 100000 --save sigref --exit-interval "$e" \
    --metrics-file sigref.jsonl
  if [ "$(numbers sig.jsonl)" = "$(numbers sigref.jsonl)" ] && [ "$(line_count sig.jsonl)" -eq "$e" ] &&
     msg=$(same_state sig/"$(printf 'iter_%07d' "$e")" sigref/"$(printf 'iter_%07d' "$e")"); then
    pass "resume after SIGTERM at $k, stop at $e: identical to an uninterrupted run"
  else
    fail "resume after SIGTERM differs from an uninterrupted run ${msg:-}"
    diff <(numbers sigref.jsonl) <(numbers sig.jsonl) | head -n 5 | sed 's/^/    /' >&2
  fi
fi

# SIGINT too.
"$LATTICE" train "${BASE[@]}" --train-iters 100000 --exit-signal-handler --save sigint \
  --metrics-file sigint.jsonl >sigint.out 2>sigint.err &
pid=$!
wait_for sigint.jsonl '"iteration"' 30
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
if [ "$rc" -eq 0 ] && [ -s sigint/latest_checkpointed_iteration.txt ]; then
  pass "SIGINT with --exit-signal-handler saved and exited 0"
else
  fail "SIGINT with --exit-signal-handler: exit status $rc, tracker $(cat sigint/latest_checkpointed_iteration.txt 2>&1)"
  tail -n 40 sigint.err | sed 's/^/    /' >&2
fi

# ---- load options ----
lr_at() { numbers "$1" | awk -v it="$2" '$1 == it { print $4 }'; }
loss_at() { numbers "$1" | awk -v it="$2" '$1 == it { print $3 }'; }
cp -r split split_base 2>/dev/null
rm -rf split_base/iter_0000006 && echo 3 >split_base/latest_checkpointed_iteration.txt

if run noopt "$LATTICE" train "${BASE[@]}" --train-iters 6 --load split_base --no-load-optim \
     --metrics-file noopt.jsonl; then
  if [ "$(loss_at noopt.jsonl 4)" = "$(loss_at straight.jsonl 4)" ] &&
     [ "$(loss_at noopt.jsonl 5)" != "$(loss_at straight.jsonl 5)" ] &&
     [ "$(lr_at noopt.jsonl 4)" != "$(lr_at straight.jsonl 4)" ]; then
    pass "--no-load-optim: same weights at iteration 4, fresh optimizer and schedule after it"
  else
    fail "--no-load-optim: losses/learning rates do not show a fresh optimizer: $(numbers noopt.jsonl | tr '\n' ';')"
  fi
fi

if run finetune "$LATTICE" train "${BASE[@]}" --train-iters 2 --load split_base --finetune \
     --metrics-file finetune.jsonl; then
  if grep -q ' iteration        1/       2 | consumed samples:            4 |' finetune.out &&
     [ "$(loss_at finetune.jsonl 1)" != "$(loss_at straight.jsonl 1)" ]; then
    pass "--finetune: trained weights, iteration and samples restart at 0"
  else
    fail "--finetune: expected iteration 1 with 4 consumed samples on the loaded weights"
  fi
fi

# --ckpt-step: a chosen iteration's checkpoint instead of the tracker's (split holds 3 and 6, the tracker
# says 6): step 3 continues at iteration 4 as the straight run does; a step it lacks is a one-line error.
if run step3 "$LATTICE" train "${BASE[@]}" --train-iters 6 --load split --ckpt-step 3 --metrics-file step3.jsonl; then
  if grep -q ' iteration        4/       6 | consumed samples:           16 |' step3.out &&
     [ "$(numbers step3.jsonl)" = "$(numbers straight.jsonl | tail -n 3)" ]; then
    pass "--ckpt-step 3 of a directory at iteration 6: iterations 4-6 as the straight run's"
  else
    fail "--ckpt-step 3: $(numbers step3.jsonl | tr '\n' ';'), straight run $(numbers straight.jsonl | tail -n 3 | tr '\n' ';')"
  fi
fi
expect_error "--ckpt-step of an iteration not saved" "--ckpt-step 4|no checkpoint of iteration 4|iterations 3, 6" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 6 --load split --ckpt-step 4
expect_error "--ckpt-step without --load" "--ckpt-step needs --load" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 6 --ckpt-step 3
# --pretrained-checkpoint: --load holds nothing yet, so the pretrained weights come in as with --finetune
# (the same first loss); the saved run then resumes from --load, not from the pretrained checkpoint again.
if run pre1 "$LATTICE" train "${BASE[@]}" --train-iters 4 --exit-interval 2 --load ft --save ft \
     --pretrained-checkpoint split_base --metrics-file pre.jsonl; then
  if grep -q 'fine-tuning from --pretrained-checkpoint split_base' pre1.out &&
     grep -q ' iteration        1/       4 | consumed samples:            4 |' pre1.out &&
     [ -n "$(loss_at pre.jsonl 1)" ] && [ "$(loss_at pre.jsonl 1)" = "$(loss_at finetune.jsonl 1)" ]; then
    pass "--pretrained-checkpoint with an empty --load: its weights, iteration 0, the --finetune run's first loss"
  else
    fail "--pretrained-checkpoint: first loss $(loss_at pre.jsonl 1), the --finetune run's $(loss_at finetune.jsonl 1)"
  fi
  if run pre2 "$LATTICE" train "${BASE[@]}" --train-iters 4 --load ft --save ft --pretrained-checkpoint split_base \
       --metrics-file pre.jsonl; then
    grep -q ' iteration        3/       4 |' pre2.out && ! grep -q 'fine-tuning from' pre2.out &&
      pass "--pretrained-checkpoint once --load holds a checkpoint: resumes from --load (iteration 3)" ||
      fail "--pretrained-checkpoint: the second run did not resume from --load"
  fi
fi
expect_error "--pretrained-checkpoint with no checkpoint anywhere" "--pretrained-checkpoint nowhere: no checkpoint" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 2 --load ft_empty --pretrained-checkpoint nowhere

# --non-persistent-save-interval: checkpoints of their own in --save/non_persistent, only the latest kept.
# A run whose last persistent checkpoint is iteration 4 and non-persistent one 5 (as if it died before its
# exit save) resumes from the newer, the non-persistent one, and continues as the straight run.
if run np1 "$LATTICE" train "${BASE[@]}" --train-iters 6 --save np --save-interval 4 --non-persistent-save-interval 1 \
     --exit-interval 5; then
  [ "$(ls np/non_persistent | grep -c '^iter_')" = 1 ] && [ -f np/non_persistent/iter_0000005/checkpoint.json ] &&
    pass "--non-persistent-save-interval: np/non_persistent keeps only iteration 5" ||
    fail "--non-persistent-save-interval: np/non_persistent holds $(ls np/non_persistent | tr '\n' ' ')"
  rm -rf np/iter_0000005 && echo 4 >np/latest_checkpointed_iteration.txt  # the exit save never happened
  if run np2 "$LATTICE" train "${BASE[@]}" --train-iters 6 --load np --save np --non-persistent-save-interval 1 \
       --metrics-file np.jsonl; then
    if grep -q 'non-persistent checkpoint np/non_persistent (iteration 5) is newer' np2.out &&
       [ "$(numbers np.jsonl)" = "$(numbers straight.jsonl | tail -n 1)" ]; then
      pass "resumed from the newer non-persistent checkpoint: iteration 6 as the straight run's"
    else
      fail "non-persistent resume: $(numbers np.jsonl | tr '\n' ';'), straight $(numbers straight.jsonl | tail -n 1)"
    fi
  fi
fi
expect_error "--non-persistent-ckpt-type local" "--non-persistent-ckpt-type local is not implemented" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 2 --save npx --non-persistent-save-interval 1 --non-persistent-ckpt-type local

# --log-progress: --save/progress.txt with Megatron's tab-separated lines: each job's start, each checkpoint's
# iteration, throughputs, model FLOPs (carried by the checkpoint: iteration 4's twice iteration 2's across
# the resume) and tokens.
if run pg1 "$LATTICE" train "${BASE[@]}" --train-iters 4 --save pg --save-interval 2 --exit-interval 2 --log-progress &&
   run pg2 "$LATTICE" train "${BASE[@]}" --train-iters 4 --save pg --load pg --save-interval 2 --log-progress; then
  if "$PY" - pg/progress.txt <<'PY'; then
import re, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
assert [r[3] for r in rows] == ["Starting job", "Saved checkpoint", "Starting job", "Saved checkpoint"], rows
assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", r[0]) and r[1].startswith("Job ID: ") and r[2] == "# GPUs: 1" for r in rows), rows
saved = [dict(f.split(": ", 1) for f in r[4:]) for r in rows if r[3] == "Saved checkpoint"]
assert [s["Iteration"] for s in saved] == ["2", "4"], saved
f2, f4 = (float(s["Floating-point operations"]) for s in saved)
assert f2 > 0 and abs(f4 - 2 * f2) <= 0.01 * f4, (f2, f4)
for s in saved:
    assert re.fullmatch(r"\d+\.\d TFLOP/s/GPU", s["Job throughput"]) and re.fullmatch(r"\d+\.\d TFLOP/s/GPU", s["Cumulative throughput"]), s
    assert s["Tokens (in billions)"] == "0.00", s
print("progress.txt: FLOPs %.3g at iteration 2, %.3g at 4" % (f2, f4))
PY
    pass "--log-progress: job starts and checkpoints in Megatron's progress.txt lines, the FLOPs carried across the resume"
  else
    fail "--log-progress: progress.txt is $(cat pg/progress.txt 2>/dev/null | tr '\t\n' ' |')"
  fi
fi
expect_error "--log-progress without --save" "--log-progress need --save" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 2 --log-progress

expect_error "scheduler mismatch names the field" "max_lr" -- \
  "$LATTICE" train "${BASE[@]/1e-3/2e-3}" --train-iters 6 --load split_base
if run override "$LATTICE" train "${BASE[@]/1e-3/2e-3}" --train-iters 6 --load split_base \
     --override-opt_param-scheduler --metrics-file override.jsonl; then
  want=$("$PY" -c 'import math; print(repr(1e-4 + 0.5 * (math.cos(math.pi * ((16 - 8) / (160 - 8))) + 1) * (2e-3 - 1e-4)))')
  got=$(lr_at override.jsonl 4)
  if [ "$got" = "$want" ]; then
    pass "--override-opt_param-scheduler: the new --lr really applies ($got at iteration 4)"
  else
    fail "--override-opt_param-scheduler: learning rate at iteration 4 is $got, expected $want"
  fi
fi
if run usecp "$LATTICE" train "${BASE[@]/1e-3/2e-3}" --train-iters 6 --load split_base \
     --use-checkpoint-opt_param-scheduler --metrics-file usecp.jsonl; then
  if [ "$(lr_at usecp.jsonl 4)" = "$(lr_at straight.jsonl 4)" ] &&
     [ "$(loss_at usecp.jsonl 6)" = "$(loss_at straight.jsonl 6)" ]; then
    pass "--use-checkpoint-opt_param-scheduler: the checkpoint's schedule applies"
  else
    fail "--use-checkpoint-opt_param-scheduler: lr $(lr_at usecp.jsonl 4), expected $(lr_at straight.jsonl 4)"
  fi
fi

expect_error "model mismatch names the field" "hidden_size|--hidden-size|split_base" -- \
  "$LATTICE" train "${BASE[@]/32/64}" --train-iters 6 --load split_base

run nosave "$LATTICE" train "${BASE[@]}" --train-iters 2 --save nosave --no-save-optim --no-save-rng
expect_error "a checkpoint without optimizer state needs --no-load-optim" "--no-load-optim|nosave" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 4 --load nosave
if run nosave2 "$LATTICE" train "${BASE[@]}" --train-iters 4 --load nosave --no-load-optim --no-load-rng; then
  grep -q ' iteration        3/' nosave2.out && pass "--no-save-optim/--no-save-rng checkpoints resume with --no-load-optim --no-load-rng"
fi

if run fresh "$LATTICE" train "${BASE[@]}" --train-iters 1 --load no_such_dir --save no_such_dir; then
  grep -qi 'no checkpoint' fresh.out && grep -q ' iteration        1/' fresh.out &&
    pass "--load of a directory without a checkpoint trains from scratch (auto-resume)"
fi

# ---- --keep-last-n, --save-retain-interval and --exit-duration-in-mins ----
if run keep "$LATTICE" train "${BASE[@]}" --train-iters 5 --save keep --save-interval 1 --keep-last-n 2; then
  got=$(cd keep && ls -d iter_* | tr '\n' ' ')
  [ "$got" = "iter_0000004 iter_0000005 " ] && pass "--keep-last-n 2 keeps the newest two" ||
    fail "--keep-last-n 2 left: $got"
fi
# Megatron's --save-retain-interval: each save removes the one before it unless a multiple of 4, so the
# multiples of 4 and the last stay. A resume from iteration 7 made a symbolic link: its first save (8)
# leaves the link alone, as Megatron does.
if run retain "$LATTICE" train "${BASE[@]}" --train-iters 11 --exit-interval 7 --save retain --save-interval 1 \
     --save-retain-interval 4; then
  got=$(cd retain && ls -d iter_* | tr '\n' ' ')
  [ "$got" = "iter_0000004 iter_0000007 " ] && pass "--save-retain-interval 4 keeps the multiples of 4 and the last" ||
    fail "--save-retain-interval 4 left: $got"
  mv retain/iter_0000007 retain/real7 && ln -s real7 retain/iter_0000007 &&
    run retain2 "$LATTICE" train "${BASE[@]}" --train-iters 11 --load retain --save retain --save-interval 1 \
      --save-retain-interval 4 &&
    got=$(cd retain && ls -d iter_* | tr '\n' ' ') &&
    { [ "$got" = "iter_0000004 iter_0000007 iter_0000008 iter_0000011 " ] && [ -L retain/iter_0000007 ] &&
        pass "resumed: the previous checkpoint, a symbolic link, is left alone; 9 and 10 removed" ||
        fail "--save-retain-interval after the resume left: $got"; }
fi
expect_error "--save-retain-interval not a multiple" "--save-retain-interval 3 must be a multiple of --save-interval 2" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 1 --save retain_bad --save-interval 2 --save-retain-interval 3
expect_error "--save-retain-interval without --save" "--save-retain-interval|need --save DIR" -- \
  "$LATTICE" train "${BASE[@]}" --train-iters 1 --save-retain-interval 4
if run dur "$LATTICE" train "${BASE[@]}" --train-iters 100000 --save dur --exit-duration-in-mins 0.000001; then
  [ "$(cat dur/latest_checkpointed_iteration.txt 2>/dev/null)" = "1" ] &&
    pass "--exit-duration-in-mins saves and exits after the first iteration past the limit" ||
    fail "--exit-duration-in-mins: tracker $(cat dur/latest_checkpointed_iteration.txt 2>&1)"
fi

e2e_finish
