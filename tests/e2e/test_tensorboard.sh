#!/usr/bin/env bash
# --tensorboard-dir: the event file lattice writes, read by an independent reader (npm's
# protobufjs with TensorFlow's Event/Summary messages, @aws-crypto/crc32c for the record CRCs:
# tests/e2e/tensorboard_reference.cjs), holds Megatron's tags with the values of the run's
# --metrics-file: every iteration's lm loss, learning rate and grad norm at the iteration and at
# the consumed samples, the validation and test losses, the iteration time; the log interval;
# one file per run (a resumed run adds one); world rank 0 alone writes under pipeline
# parallelism; --multiple-validation-sets' losses per set; bad flags are one-line errors; the
# reader rejects a damaged file.
#   bash tests/e2e/test_tensorboard.sh <lattice> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

NPM_DIR=${LATTICE_NPM_DIR:-$(dirname "$LATTICE")/npm}
if ! "$SRC/scripts/install-tokenizer-assets.sh" "$NPM_DIR" >/dev/null; then
  echo "FAIL: the reference reader's npm packages are not available in $NPM_DIR" >&2
  exit 1
fi
read_events() { node "$SRC/tests/e2e/tensorboard_reference.cjs" "$NPM_DIR" "$@"; }

for i in $(seq 1 60); do
  printf '{"text": "document %d: the quick brown fox jumps over the lazy dog %d times"}\n' "$i" "$((i * 7))"
done >corpus.jsonl
"$LATTICE" preprocess --input corpus.jsonl --json-keys text --tokenizer-type ByteTokenizer \
  --output-prefix corpus --append-eod >prep.log 2>&1 || { fail "preprocess: $(tail -n 2 prep.log)"; e2e_finish; }
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
       --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --train-iters 6
       --log-interval 1 --seed 1234 --peak-tflops 1 --data-path corpus_text_document --tokenizer-type ByteTokenizer
       --split 80,10,10 --eval-interval 3 --eval-iters 1)

# value TAG STEP FILE: the scalar's value at that step (nothing if absent)
value() { grep -F "\"tag\":\"$1\"" "$3" | grep -F "\"step\":$2," | head -n 1 | grep -o '"value":[^,]*' | cut -d: -f2; }
# metric KEY ITER: the metrics file's value for that iteration's line holding KEY
metric() { grep "\"iteration\":$2[,}]" metrics.jsonl | grep -o "\"$1\":[^,}]*" | head -n 1 | cut -d: -f2; }
# same_f32 A B: the two numbers are equal as float32 (TensorBoard stores float)
same_f32() { node -e 'const [a, b] = process.argv.slice(1).map(Number); process.exit(Math.fround(a) === Math.fround(b) ? 0 : 1)' "$1" "$2"; }

if "$LATTICE" "${TRAIN[@]}" --metrics-file metrics.jsonl --tensorboard-dir tb --log-timers-to-tensorboard \
     --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --log-params-norm --log-num-zeros-in-grad \
     --log-memory-to-tensorboard --save ckpt --exit-interval 4 >run1.log 2>&1; then
  files=(tb/events.out.tfevents.*)
  [ "${#files[@]}" -eq 1 ] || fail "expected one event file in tb, found ${#files[@]}"
  grep -qF "> TensorBoard events: ${files[0]}" run1.log || fail "the log does not name the event file"
  if read_events "${files[0]}" >events.txt 2>reader.err; then
    [ "$(head -n 1 events.txt)" = "brain.Event:2" ] || fail "first record: '$(head -n 1 events.txt)', want brain.Event:2"
    bad=0
    for it in 1 2 3 4; do
      for pair in "lm loss=lm_loss" "learning-rate=learning_rate" "grad-norm=grad_norm" "loss-scale=loss_scale" \
                  "params-norm=params_norm" "num-zeros=num_zeros_in_grad"; do
        tag=${pair%%=*} key=${pair#*=}
        want=$(metric "$key" $it) got=$(value "$tag" $it events.txt) got_s=$(value "$tag vs samples" $((it * 4)) events.txt)
        if [ -z "$got" ] || [ -z "$got_s" ] || ! same_f32 "$got" "$want" || ! same_f32 "$got_s" "$want"; then
          fail "iteration $it: '$tag' is '$got' (at samples: '$got_s'), the metrics file's $key '$want'"
          bad=1
        fi
      done
      [ "$(value batch-size $it events.txt)" = 4 ] || { fail "iteration $it: batch-size '$(value batch-size $it events.txt)'"; bad=1; }
      [ "$(value world-size $it events.txt)" = 1 ] || { fail "iteration $it: world-size"; bad=1; }
      [ -n "$(value iteration-time $it events.txt)" ] || { fail "iteration $it: no iteration-time"; bad=1; }
      # --log-memory-to-tensorboard: the process's resident bytes hold lattice's buffers, whose bytes
      # reach at most their peak; some buffers are alive.
      res=$(value mem-reserved-bytes $it events.txt) alloc=$(value mem-allocated-bytes $it events.txt)
      peak=$(value mem-max-allocated-bytes $it events.txt) count=$(value mem-allocated-count $it events.txt)
      node -e 'const [r, a, p, c] = process.argv.slice(1).map(Number); process.exit(a > 0 && p >= a && r > a && c > 0 ? 0 : 1)' \
        "$res" "$alloc" "$peak" "$count" ||
        { fail "iteration $it: memory scalars reserved '$res' allocated '$alloc' peak '$peak' count '$count'"; bad=1; }
    done
    [ "$bad" = 0 ] && pass "iterations 1-4: lm loss, learning rate, grad norm, loss scale, params norm, num zeros as the metrics file, at the iteration and the samples; the memory scalars"
    line=$(grep -m 1 ' iteration        1/' run1.log)
    [[ $line == *"| grad norm: "*" | num zeros: "*" | params norm: "*" | number of skipped iterations:"* ]] &&
      pass "the log line has Megatron's num zeros and params norm: ${line#*grad norm}" ||
      fail "the log line lacks num zeros / params norm in Megatron's place: $line"
    want=$(grep '"val_loss"' metrics.jsonl | grep '"iteration":3,' | grep -o '"val_loss":[^,}]*' | cut -d: -f2)
    got=$(value "lm loss validation" 3 events.txt)
    if [ -n "$want" ] && [ -n "$got" ] && same_f32 "$got" "$want" && [ -n "$(value "lm loss validation ppl" 3 events.txt)" ] &&
       [ -n "$(value "lm loss validation vs samples" 12 events.txt)" ]; then
      pass "validation loss at iteration 3: $got, with its perplexity"
    else
      fail "validation loss: tensorboard '$got', metrics '$want'"
    fi
    [ -z "$(value "lm loss" 5 events.txt)" ] || fail "the run exited after iteration 4 but logged iteration 5"
  else
    fail "the reference reader rejected the event file: $(cat reader.err)"
  fi
else
  fail "training with --tensorboard-dir failed: $(tail -n 3 run1.log)"
fi

# ---- a resumed run adds its own file; the test loss at the end ----
sleep 1  # a new file name (seconds in it)
if "$LATTICE" "${TRAIN[@]}" --metrics-file metrics.jsonl --tensorboard-dir tb --load ckpt --save ckpt >run2.log 2>&1; then
  files=(tb/events.out.tfevents.*)
  if [ "${#files[@]}" -eq 2 ]; then
    new=$(ls -t tb/events.out.tfevents.* | head -n 1)
    if read_events "$new" >events2.txt 2>reader2.err; then
      [ -z "$(value "lm loss" 4 events2.txt)" ] && [ -n "$(value "lm loss" 5 events2.txt)" ] &&
        [ -n "$(value "lm loss" 6 events2.txt)" ] && pass "the resumed run's file holds iterations 5 and 6" ||
        fail "the resumed run's file: $(grep -c '"lm loss"' events2.txt) lm loss scalars"
      want=$(grep '"test_loss"' metrics.jsonl | grep -o '"test_loss":[^,}]*' | cut -d: -f2)
      got=$(value "lm loss test" 6 events2.txt)
      [ -n "$want" ] && [ -n "$got" ] && same_f32 "$got" "$want" && pass "test loss $got" ||
        fail "test loss: tensorboard '$got', metrics '$want'"
      [ -z "$(value iteration-time 5 events2.txt)" ] || fail "iteration-time without --log-timers-to-tensorboard"
      [ -z "$(value mem-allocated-bytes 5 events2.txt)" ] || fail "mem-allocated-bytes without --log-memory-to-tensorboard"
    else
      fail "the reader rejected the resumed run's file: $(cat reader2.err)"
    fi
  else
    fail "after resuming: ${#files[@]} event files in tb, want 2"
  fi
else
  fail "resumed training failed: $(tail -n 3 run2.log)"
fi

# ---- --tensorboard-log-interval ----
if "$LATTICE" "${TRAIN[@]}" --tensorboard-dir tb3 --tensorboard-log-interval 2 >run3.log 2>&1 &&
   read_events tb3/events.out.tfevents.* >events3.txt; then
  steps=$(grep -F '"tag":"lm loss"' events3.txt | grep -o '"step":[0-9]*' | cut -d: -f2 | tr '\n' ' ')
  [ "$steps" = "2 4 6 " ] && pass "--tensorboard-log-interval 2: lm loss at iterations $steps" ||
    fail "--tensorboard-log-interval 2: lm loss at iterations '$steps', want 2 4 6"
else
  fail "--tensorboard-log-interval run failed: $(tail -n 3 run3.log)"
fi

# ---- pipeline parallelism: world rank 0 writes the last stage's loss ----
if command -v mpirun >/dev/null 2>&1; then
  if mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" \
       --pipeline-model-parallel-size 2 --tensorboard-dir tb4 >run4.log 2>&1; then
    files=(tb4/events.out.tfevents.*)
    if [ "${#files[@]}" -eq 1 ] && read_events "${files[0]}" >events4.txt &&
       read_events tb3/events.out.tfevents.* >/dev/null; then
      a=$(value "lm loss" 6 events4.txt) b=$(value "lm loss" 6 events3.txt)
      [ -n "$a" ] && node -e 'const [a,b]=process.argv.slice(1).map(Number); process.exit(Math.abs(a-b) <= 1e-5*Math.abs(b) ? 0 : 1)' "$a" "$b" &&
        pass "PP=2: one event file, iteration 6's lm loss $a as one process's $b" ||
        fail "PP=2: iteration 6's lm loss '$a', one process '$b'"
    else
      fail "PP=2: ${#files[@]} event files, or unreadable"
    fi
  else
    fail "PP=2 with --tensorboard-dir failed: $(tail -n 3 run4.log)"
  fi
fi

# ---- MoE: Megatron's load_balancing_loss and z_loss tags; --moe-per-layer-logging's per layer ----
# Each iteration's values as the metrics file's (log interval 1); a dense layer (--moe-layer-freq) has
# none; the layers' mean is the logged loss; under PP=2 (each stage its layers) the values of one process.
MOE=()
for a in "${TRAIN[@]}"; do [ "${MOE[${#MOE[@]}-1]:-}" = --num-layers ] && MOE+=(4) || MOE+=("$a"); done  # 4 layers
MOE+=(--disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32
     --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 --moe-layer-freq "[1,0,1,1]" --moe-per-layer-logging)
# layers KEY ITER FILE: the metrics line's per-layer array for that iteration, space separated
layers() { grep "\"iteration\":$2[,}]" "$3" | grep -o "\"$1\":\[[^]]*\]" | sed 's/.*\[//; s/\]//; s/,/ /g'; }
if "$LATTICE" "${MOE[@]}" --metrics-file moe.jsonl --tensorboard-dir tbm >runm.log 2>&1 &&
   read_events tbm/events.out.tfevents.* >eventsm.txt 2>readerm.err; then
  bad=0
  for it in 1 3 6; do
    for key in load_balancing_loss z_loss; do
      want=$(grep "\"iteration\":$it[,}]" moe.jsonl | grep -o "\"$key\":[^,}]*" | cut -d: -f2)
      got=$(value "$key" $it eventsm.txt)
      { [ -n "$got" ] && same_f32 "$got" "$want"; } || { fail "iteration $it: '$key' '$got', metrics '$want'"; bad=1; }
      read -r -a per <<<"$(layers "${key}_layers" $it moe.jsonl)"
      [ "${#per[@]}" = 4 ] && [ "${per[1]}" = null ] || { fail "iteration $it: ${key}_layers '${per[*]}'"; bad=1; continue; }
      [ -z "$(value "moe/${key}_layer_1" $it eventsm.txt)" ] || { fail "iteration $it: a dense layer's moe/${key}_layer_1"; bad=1; }
      for l in 0 2 3; do
        got=$(value "moe/${key}_layer_$l" $it eventsm.txt)
        { [ -n "$got" ] && same_f32 "$got" "${per[$l]}"; } ||
          { fail "iteration $it: moe/${key}_layer_$l '$got', metrics '${per[$l]}'"; bad=1; }
      done
      node -e 'const v = process.argv.slice(1).map(Number); const m = (v[0] + v[1] + v[2]) / 3;
               process.exit(Math.abs(m - v[3]) <= 1e-12 * Math.abs(v[3]) ? 0 : 1)' "${per[0]}" "${per[2]}" "${per[3]}" "$want" ||
        { fail "iteration $it: the mean of ${per[*]} is not $key $want"; bad=1; }
    done
  done
  [ "$bad" = 0 ] && pass "MoE: load_balancing_loss, z_loss and each MoE layer's (moe/<name>_layer_<i>) as the metrics file; their mean is the loss"
  if command -v mpirun >/dev/null 2>&1; then
    if mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE" "${MOE[@]}" \
         --pipeline-model-parallel-size 2 --metrics-file moe_pp.jsonl >runm_pp.log 2>&1; then
      a=$(layers load_balancing_loss_layers 6 moe_pp.jsonl) b=$(layers load_balancing_loss_layers 6 moe.jsonl)
      node -e 'const [a, b] = process.argv.slice(1).map(s => s.split(" "));
               process.exit(a.length === 4 && a.every((x, i) => x === "null" ? b[i] === "null" :
                            Math.abs(Number(x) - Number(b[i])) <= 1e-5 * Math.abs(Number(b[i]))) ? 0 : 1)' "$a" "$b" &&
        pass "PP=2: each layer's load-balancing loss at iteration 6 as one process's ($a)" ||
        fail "PP=2: per-layer load-balancing losses '$a', one process '$b'"
    else
      fail "PP=2 MoE run failed: $(tail -n 3 runm_pp.log)"
    fi
  fi
else
  fail "MoE run with --moe-per-layer-logging failed: $(tail -n 3 runm.log) $(cat readerm.err 2>/dev/null)"
fi
expect_error "--moe-per-layer-logging without experts" "--moe-per-layer-logging" -- \
  "$LATTICE" "${TRAIN[@]}" --moe-per-layer-logging

# ---- --multiple-validation-sets: each --valid-data-path dataset evaluated alone ----
# Set 1's losses are those of a run validating on that dataset alone (evaluation changes no training),
# in the log (Megatron's "validation-1 loss at ..."), the metrics file (val_1_loss) and TensorBoard
# ("lm loss validation-1"); `lattice plot` draws a curve per set.
for i in $(seq 1 30); do
  printf '{"text": "line %d of another corpus: pack my box with five dozen liquor jugs"}\n' "$i"
done >corpus2.jsonl
"$LATTICE" preprocess --input corpus2.jsonl --json-keys text --tokenizer-type ByteTokenizer \
  --output-prefix corpus2 --append-eod >prep2.log 2>&1 || fail "preprocess corpus2: $(tail -n 2 prep2.log)"
SETS=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 6 --log-interval 1 --seed 1234
      --tokenizer-type ByteTokenizer --train-data-path corpus_text_document --eval-interval 3 --eval-iters 2)
if "$LATTICE" "${SETS[@]}" --valid-data-path corpus_text_document corpus2_text_document --multiple-validation-sets \
     --metrics-file sets.jsonl --tensorboard-dir tbs >runs.log 2>&1 &&
   "$LATTICE" "${SETS[@]}" --valid-data-path corpus2_text_document --metrics-file alone.jsonl >runa.log 2>&1 &&
   read_events tbs/events.out.tfevents.* >eventss.txt 2>readers.err; then
  # field FILE KEY ITER: the value of KEY on that iteration's line holding it
  field() { grep "\"iteration\":$3[,}]" "$1" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2; }
  bad=0
  for it in 3 6; do
    set1=$(field sets.jsonl val_1_loss $it) alone=$(field alone.jsonl val_loss $it) set0=$(field sets.jsonl val_0_loss $it)
    { [ -n "$set1" ] && [ "$set1" = "$alone" ] && [ -n "$set0" ] && [ "$set0" != "$set1" ]; } ||
      { fail "iteration $it: val_0_loss '$set0', val_1_loss '$set1', the lone set's val_loss '$alone'"; bad=1; }
    for k in 0 1; do
      got=$(value "lm loss validation-$k" $it eventss.txt) want=$(field sets.jsonl val_${k}_loss $it)
      { [ -n "$got" ] && same_f32 "$got" "$want"; } || { fail "iteration $it: lm loss validation-$k '$got', metrics '$want'"; bad=1; }
    done
  done
  [ -z "$(grep '"val_loss"' sets.jsonl)" ] && [ -z "$(value "lm loss validation" 3 eventss.txt)" ] ||
    { fail "a blended validation loss besides the sets'"; bad=1; }
  grep -qF ' validation-0 loss at iteration 3 | lm loss value: ' runs.log &&
    grep -qF ' validation-1 loss at iteration 6 on validation set | lm loss value: ' runs.log ||
    { fail "the log lacks Megatron's validation-<i> lines: $(grep -m 2 'loss at' runs.log)"; bad=1; }
  [ "$bad" = 0 ] && pass "two validation sets: each its own loss (set 1's as validating on it alone: $set1), logged, in the metrics file and TensorBoard"
  if "$LATTICE" plot --metrics-file sets.jsonl --output sets.svg >plot.log 2>&1; then
    grep -q 'class="val_0_loss"' sets.svg && grep -q 'class="val_1_loss"' sets.svg && grep -qF 'validation-1 loss' sets.svg &&
      pass "lattice plot: a curve per validation set" || fail "lattice plot: no val_0_loss/val_1_loss curves"
  else
    fail "lattice plot of two validation sets: $(cat plot.log)"
  fi
else
  fail "--multiple-validation-sets runs failed: $(tail -n 2 runs.log) $(tail -n 2 runa.log) $(cat readers.err 2>/dev/null)"
fi
expect_error "--multiple-validation-sets with weights" "--multiple-validation-sets|takes no weights" -- \
  "$LATTICE" "${SETS[@]}" --valid-data-path 1 corpus_text_document 1 corpus2_text_document --multiple-validation-sets
expect_error "--multiple-validation-sets without --valid-data-path" "--multiple-validation-sets|--valid-data-path" -- \
  "$LATTICE" "${TRAIN[@]}" --multiple-validation-sets

# ---- errors, and the reader's own checks ----
touch not-a-dir
expect_error "--tensorboard-dir on a file" "--tensorboard-dir|not-a-dir" -- "$LATTICE" "${TRAIN[@]}" --tensorboard-dir not-a-dir
expect_error "--log-timers-to-tensorboard without a dir" "--log-timers-to-tensorboard|--tensorboard-dir" -- \
  "$LATTICE" "${TRAIN[@]}" --log-timers-to-tensorboard
expect_error "--tensorboard-log-interval 0" "--tensorboard-log-interval" -- \
  "$LATTICE" "${TRAIN[@]}" --tensorboard-dir tb5 --tensorboard-log-interval 0
f=$(ls tb3/events.out.tfevents.* | head -n 1)
cp "$f" damaged
printf '\x55' | dd of=damaged bs=1 seek=200 conv=notrunc status=none
if read_events damaged >/dev/null 2>damaged.err; then
  fail "the reference reader accepted a damaged event file"
else
  pass "the reference reader rejects a damaged file: $(cat damaged.err)"
fi

e2e_finish
