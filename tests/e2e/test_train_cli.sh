#!/usr/bin/env bash
# lattice train as a user runs it: --help, Megatron's log line, --metrics-file, --save, generate
# and plot on the result, and run-to-run determinism (same run twice; 1 vs 2 threads).
#   bash tests/e2e/test_train_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

TINY=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 3
      --lr 1e-3 --min-lr 1e-4 --log-interval 1 --seed 1234 --eval-iters 0)
MOCK=(--mock-data --vocab-size 64)

# lm_loss values of a metrics file, one per line, exactly as written (no float round trip).
losses() { grep -o '"lm_loss":[^,}]*' "$1"; }

# ---- --help ----
if run help "$LATTICE" train --help; then
  for pat in '--num-layers' '--hidden-size' '--num-attention-heads' '--seq-length' '--lr' \
             '--micro-batch-size' '--global-batch-size' '--train-iters' '--data-path' '--mock-data' \
             '--save' '--metrics-file' '--num-threads' '--tokenizer-type'; do
    grep -qF -- "$pat" help.out || fail "train --help does not list $pat"
  done
  grep -E -- '--weight-decay .*\[0\.01\]' help.out >/dev/null ||
    fail "train --help does not show --weight-decay with its default [0.01]"
  grep -E -- '--seed .*\[1234\]' help.out >/dev/null ||
    fail "train --help does not show --seed with its default [1234]"
  grep -E -- '--log-interval .*\[100\]' help.out >/dev/null ||
    fail "train --help does not show --log-interval with its default [100]"
  pass "train --help lists the flags with their defaults"

# ---- every command answers --help (stdout, exit 0) and --version ----
for cmd in train preprocess merge-datasets generate convert data plot schedule; do
  if run "help-$cmd" "$LATTICE" "$cmd" --help && grep -q "^usage: lattice $cmd" "help-$cmd.out"; then
    pass "$cmd --help"
  else
    fail "$cmd --help printed no 'usage: lattice $cmd' line on stdout"
  fi
done
for flag in --load --prompt --prompt-file --max-new-tokens --temperature --top-k --top-p --seed \
            --tokenizer-type --vocab-file --merge-file --no-kv-cache --bf16 --device; do
  grep -qF -- "  $flag " help-generate.out || fail "generate --help does not list $flag"
done
for flag in --from-hf --to-hf --load --save --tokenizer-type --make-vocab-size-divisible-by; do
  grep -qF -- "$flag" help-convert.out || fail "convert --help does not list $flag"
done
expect_error "generate: unknown flag" "--bogus|lattice generate --help" -- "$LATTICE" generate --bogus 1
if run version "$LATTICE" --version && grep -qE '^lattice [0-9]+\.[0-9]+\.[0-9]+$' version.out; then
  pass "--version: $(cat version.out)"
else
  fail "--version printed '$(cat version.out)'"
fi
fi

# ---- a tiny mock-data run: log line, metrics file, checkpoint ----
if run mock "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" --metrics-file metrics.jsonl --save ckpt; then
  for pat in ' iteration        1/       3 | consumed samples:            4 |' \
             ' iteration        3/       3 | consumed samples:           12 |' \
             'elapsed time per iteration (ms):' 'learning rate:' 'global batch size:     4' \
             'lm loss:' 'loss scale:' 'grad norm:' 'number of skipped iterations:' \
             'number of nan iterations:' 'tokens per second:'; do
    grep -qF -- "$pat" mock.out || fail "train log lacks '$pat'"
  done
  n=$(grep -c '^ iteration ' mock.out)
  [ "$n" -eq 3 ] || fail "expected 3 log lines with --log-interval 1, got $n"
  grep -E 'lm loss: [0-9]\.[0-9]{6}E[+-][0-9]{2} \|' mock.out >/dev/null ||
    fail "lm loss is not printed in Megatron's %E format"
  pass "train prints Megatron's log line"

  if [ ! -f metrics.jsonl ]; then
    fail "--metrics-file metrics.jsonl was not written"
  else
    n=$(line_count metrics.jsonl)
    [ "$n" -eq 3 ] || fail "metrics.jsonl has $n lines, expected one per logged iteration (3)"
    if ! python3 - metrics.jsonl <<'PY'; then
import json, math, sys
keys = ["iteration", "consumed_samples", "lm_loss", "learning_rate", "grad_norm", "loss_scale",
        "elapsed_ms", "tokens_per_sec", "tflops_per_gpu"]
rows = [json.loads(line) for line in open(sys.argv[1])]
bad = []
for i, r in enumerate(rows):
    if not isinstance(r, dict):
        bad.append(f"line {i + 1} is not a JSON object")
        continue
    missing = [k for k in keys if k not in r]
    if missing:
        bad.append(f"line {i + 1} lacks {missing}")
        continue
    nonnum = [k for k in keys if not isinstance(r[k], (int, float)) or not math.isfinite(r[k])]
    if nonnum:
        bad.append(f"line {i + 1}: not finite numbers: {nonnum}")
if not bad:
    if [r["iteration"] for r in rows] != [1, 2, 3]:
        bad.append(f"iterations {[r['iteration'] for r in rows]}, expected [1, 2, 3]")
    if [r["consumed_samples"] for r in rows] != [4, 8, 12]:
        bad.append(f"consumed_samples {[r['consumed_samples'] for r in rows]}, expected [4, 8, 12]")
    if not all(0 < r["lm_loss"] < 10 for r in rows):
        bad.append("lm_loss out of range")
for b in bad:
    print("metrics.jsonl:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
      fail "metrics.jsonl does not hold the expected JSON objects"
    else
      pass "metrics file has one JSON object per logged iteration with the expected keys"
    fi
  fi

  if [ ! -s ckpt/iter_0000003/model.safetensors ]; then
    fail "--save ckpt did not write ckpt/iter_0000003/model.safetensors"
  elif [ "$(tr -d '[:space:]' < ckpt/latest_checkpointed_iteration.txt 2>/dev/null)" != "3" ]; then
    fail "ckpt/latest_checkpointed_iteration.txt does not contain 3"
  else
    pass "--save wrote iter_0000003/model.safetensors and latest_checkpointed_iteration.txt"
  fi
fi

# ---- determinism: the same run twice gives identical losses ----
DROP=(--hidden-dropout 0.1 --attention-dropout 0.1)
run det1 "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" "${DROP[@]}" --metrics-file det1.jsonl
run det2 "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" "${DROP[@]}" --metrics-file det2.jsonl
if [ -s det1.jsonl ] && [ "$(losses det1.jsonl)" = "$(losses det2.jsonl)" ]; then
  pass "the same run twice gives identical lm_loss values"
else
  fail "the same run twice gives different lm_loss values: $(losses det1.jsonl | tr '\n' ' ') vs $(losses det2.jsonl | tr '\n' ' ')"
fi

# ---- --calculate-per-token-loss: the loss does not depend on the micro-batch size ----
# Mock documents have different lengths, so --eod-mask-loss leaves micro-batches of 1 sample
# different token counts: the default mean of means moves with the split, the token mean does not.
PT=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
    --global-batch-size 4 --train-iters 3 --lr 1e-3 --log-interval 1 --seed 7 --mock-data --vocab-size 64
    --hidden-dropout 0 --attention-dropout 0 --eod-mask-loss)
# max_rel_diff A B: the largest relative difference between the lm_loss values of two metrics files.
max_rel_diff() { paste <(losses "$1" | cut -d: -f2) <(losses "$2" | cut -d: -f2) |
                 awk '{ d = ($1 - $2) / $2; d = d < 0 ? -d : d; if (d > m) m = d } END { printf "%.2e", m + 0 }'; }
for mbs in 1 4; do
  run "pt$mbs" "$LATTICE" train "${PT[@]}" --micro-batch-size $mbs --calculate-per-token-loss --metrics-file "pt$mbs.jsonl"
  run "mean$mbs" "$LATTICE" train "${PT[@]}" --micro-batch-size $mbs --metrics-file "mean$mbs.jsonl"
done
d=$(max_rel_diff pt1.jsonl pt4.jsonl) m=$(max_rel_diff mean1.jsonl mean4.jsonl)
awk -v d="$d" -v m="$m" 'BEGIN { exit !(d < 1e-5 && m > 1e-4) }' &&
  pass "--calculate-per-token-loss: micro-batches of 1 and 4 give the same losses ($d; mean of means: $m)" ||
  fail "--calculate-per-token-loss: losses differ by $d between micro-batches of 1 and 4 (mean of means: $m)"

# ---- Megatron's implementation flags change nothing; its older rope spelling is rope ----
IMPL=(--use-mcore-models --transformer-impl transformer_engine --use-flash-attn --attention-softmax-in-fp32
      --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion --no-bias-swiglu-fusion --no-rope-fusion
      --no-gradient-accumulation-fusion --no-async-tensor-model-parallel-allreduce --overlap-p2p-communication
      --manual-gc --distributed-backend nccl --num-workers 8 --dataloader-type single --timing-log-level 2 --accumulate-allreduce-grads-in-fp32
      --cross-entropy-loss-fusion --no-persist-layer-norm --use-cpu-initialization --no-create-attention-mask-in-dataloader
      --no-mmap-bin-files --num-dataset-builder-threads 4 --deterministic-mode --apply-query-key-layer-scaling
      --empty-unused-memory-level 1 --async-save --moe-grouped-gemm --moe-permute-fusion --moe-token-dispatcher-type alltoall
      --expert-tensor-parallel-size 1 --moe-router-fusion --moe-use-legacy-grouped-gemm --ckpt-format torch_dist
      --ckpt-fully-parallel-save --ckpt-fully-parallel-load --ckpt-assume-constant-structure --rerun-mode disabled
      --overlap-moe-expert-parallel-comm --delay-wgrad-compute --ddp-average-in-collective --fp8-recipe delayed
      --data-parallel-random-init --no-align-grad-reduce --no-align-param-gather --te-rng-tracker
      --inference-rng-tracker --enable-cuda-graph --external-cuda-graph --cuda-graph-scope full_iteration
      --manual-gc-interval 10 --no-manual-gc-eval --local-rank=0 --use-dist-ckpt --dist-ckpt-format torch_dist
      --fp8-interval 1 --no-initialization --disable-bf16-reduced-precision-matmul
      --no-clone-scatter-output-in-embedding --disable-gloo-process-groups --train-sync-interval 4
      --cross-entropy-fusion-impl te --overlap-p2p-communication-warmup-flush --no-scatter-gather-tensors-in-pipeline
      --defer-embedding-wgrad-compute --wgrad-deferral-limit 2 --no-gradient-reduce-div-fusion --timing-log-option all
      --no-barrier-with-level-1-timing --logging-level 20 --use-te-activation-func --disable-tp-comm-bulk-dgrad
      --disable-tp-comm-bulk-wgrad --disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs --disable-tp-comm-split-ag
      --disable-tp-comm-split-rs --tp-comm-overlap-rs-dgrad --tp-comm-bootstrap-backend mpi
      --error-injection-rate 1000 --error-injection-type persistent_error)
run impl "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" "${DROP[@]}" "${IMPL[@]}" --metrics-file impl.jsonl
[ -s impl.jsonl ] && [ "$(losses impl.jsonl)" = "$(losses det1.jsonl)" ] &&
  pass "Megatron's implementation flags leave the losses identical" ||
  fail "Megatron's implementation flags changed the losses: $(losses impl.jsonl | tr '\n' ' ')"
ROPE=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr 1e-3 --log-interval 1 --seed 3 --eval-iters 0
      --mock-data --vocab-size 64)
run rope_new "$LATTICE" train "${ROPE[@]}" --position-embedding-type rope --metrics-file rope_new.jsonl
run rope_old "$LATTICE" train "${ROPE[@]}" --use-rotary-position-embeddings --no-position-embedding --metrics-file rope_old.jsonl
[ -s rope_old.jsonl ] && [ "$(losses rope_old.jsonl)" = "$(losses rope_new.jsonl)" ] &&
  pass "--use-rotary-position-embeddings --no-position-embedding is --position-embedding-type rope" ||
  fail "--use-rotary-position-embeddings differs from --position-embedding-type rope"
expect_error "--no-position-embedding without rope" "--no-position-embedding|rope" -- \
  "$LATTICE" train "${ROPE[@]}" --no-position-embedding
expect_error "--transformer-impl value" "--transformer-impl|fast" -- "$LATTICE" train "${ROPE[@]}" --transformer-impl fast
expect_error "--rerun-mode validate_results" "--rerun-mode validate_results is not implemented" -- \
  "$LATTICE" train "${ROPE[@]}" --rerun-mode validate_results
expect_error "--ckpt-format torch" "--ckpt-format torch is not implemented: lattice writes one layout-independent" -- \
  "$LATTICE" train "${ROPE[@]}" --ckpt-format torch
expect_error "fp32 and bf16 gradient reduction" "--accumulate-allreduce-grads-in-fp32|--grad-reduce-in-bf16" -- \
  "$LATTICE" train "${ROPE[@]}" --bf16 --accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16
expect_error "--empty-unused-memory-level value" "--empty-unused-memory-level|3" -- \
  "$LATTICE" train "${ROPE[@]}" --empty-unused-memory-level 3
expect_error "--exit-on-missing-checkpoint" "--load|nockpt|--exit-on-missing-checkpoint" -- \
  "$LATTICE" train "${ROPE[@]}" --load nockpt --exit-on-missing-checkpoint

# ---- NullTokenizer: text that is token ids, preprocessed, trained on and generated from ----
printf '{"text": "3 1 4 1 5 9 2 6 5 3 5"}\n{"text": "2 7 1 8 2 8"}\n' >ids.jsonl
NULLTOK=(--tokenizer-type NullTokenizer --vocab-size 12)
if run null_pre "$LATTICE" preprocess --input ids.jsonl --output-prefix ids "${NULLTOK[@]}" --append-eod --no-progress &&
   run null_samples "$LATTICE" data samples --data-path ids_text_document --seq-length 18 --num-samples 1 --split 100,0,0; then
  [ "$(cat null_samples.out)" = "[3,1,4,1,5,9,2,6,5,3,5,12,2,7,1,8,2,8,12]" ] &&
    pass "preprocess with NullTokenizer: the ids as written, 12 (--vocab-size) ending each document" ||
    fail "preprocess with NullTokenizer: sample $(cat null_samples.out)"
fi
run null_train "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 4 \
  --max-position-embeddings 8 --micro-batch-size 1 --global-batch-size 1 --train-iters 2 --lr 1e-3 --eval-iters 0 \
  --data-path ids_text_document --split 100,0,0 "${NULLTOK[@]}" --save null_ckpt &&
  run null_gen "$LATTICE" generate --load null_ckpt --prompt "3 1 4" --max-new-tokens 3 --temperature 0 &&
  { grep -Eq '^3 1 4( [0-9]+){1,3}$' null_gen.out && pass "generate with NullTokenizer: $(cat null_gen.out)" ||
    fail "generate with NullTokenizer: '$(cat null_gen.out)'"; }
# A step whose loss turns nan (a learning rate that overflows the weights) stops training before
# its update, as Megatron's check does; --no-check-for-nan-in-loss-and-grad trains on (as Megatron,
# counting nan iterations among skipped ones only).
NAN=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
     --eval-iters 0 "${MOCK[@]}" --lr 1e38 --train-iters 4 --log-interval 1)
expect_error "nan loss" "iteration 2: the loss is not finite (loss nan, gradient norm nan)|--no-check-for-nan-in-loss-and-grad" -- \
  "$LATTICE" train "${NAN[@]}" --save nanckpt --save-interval 1
[ "$(cat nanckpt/latest_checkpointed_iteration.txt 2>/dev/null)" = 1 ] &&
  pass "the nan step left the last checkpoint (iteration 1) as it was" || fail "checkpoints after a nan step: $(ls nanckpt 2>&1)"
if "$LATTICE" train "${NAN[@]}" --no-check-for-nan-in-loss-and-grad > nanon.log 2>&1 &&
   grep -q "iteration        4/       4 .*lm loss: -*NAN" nanon.log; then
  pass "--no-check-for-nan-in-loss-and-grad trains on through the nan loss"
else
  fail "--no-check-for-nan-in-loss-and-grad: $(tail -2 nanon.log)"
fi
expect_error "NullTokenizer without --vocab-size" "--vocab-size|NullTokenizer" -- \
  "$LATTICE" preprocess --input ids.jsonl --output-prefix nope --tokenizer-type NullTokenizer
expect_error "NullTokenizer: a word that is not an id" "line 1|'13'|0..12" -- \
  "$LATTICE" preprocess --input <(echo '{"text": "1 13"}') --output-prefix nope "${NULLTOK[@]}"

# ---- thread-count invariance (dropout on) ----
# thread_invariance LABEL ARGS...: lm_loss must be the same with OMP_NUM_THREADS=1/2 and
# --num-threads 1/2.
thread_invariance() {
  local label=$1 f got ref bad=0
  shift
  OMP_NUM_THREADS=1 run "$label-omp1" "$LATTICE" train "$@" --metrics-file "$label-omp1.jsonl"
  OMP_NUM_THREADS=2 run "$label-omp2" "$LATTICE" train "$@" --metrics-file "$label-omp2.jsonl"
  run "$label-nt1" "$LATTICE" train "$@" --num-threads 1 --metrics-file "$label-nt1.jsonl"
  run "$label-nt2" "$LATTICE" train "$@" --num-threads 2 --metrics-file "$label-nt2.jsonl"
  ref=$(losses "$label-nt1.jsonl" 2>/dev/null)
  if [ -z "$ref" ]; then
    fail "$label: thread-count runs wrote no lm_loss values"
    return
  fi
  for f in omp1 omp2 nt2; do
    got=$(losses "$label-$f.jsonl" 2>/dev/null)
    if [ "$got" != "$ref" ]; then
      fail "$label: lm_loss depends on the thread count: --num-threads 1: $(echo $ref) vs $f: $(echo $got)"
      bad=1
    fi
  done
  [ "$bad" -eq 0 ] && pass "$label: lm_loss identical with OMP_NUM_THREADS=1/2 and --num-threads 1/2"
}
thread_invariance tiny "${TINY[@]}" "${MOCK[@]}" "${DROP[@]}"
# A wider model, big enough that the GEMMs are split between threads.
thread_invariance wide --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
  --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --train-iters 3 \
  --lr 1e-3 --log-interval 1 --seed 7 --mock-data --vocab-size 64 "${DROP[@]}"

# ---- train on a preprocessed ByteTokenizer dataset, then generate and plot ----
for i in $(seq 1 20); do
  printf '{"text": "ab ab abc %d: the quick brown fox jumps over the lazy dog"}\n' "$i"
done > corpus.jsonl
if run prep "$LATTICE" preprocess --input corpus.jsonl --json-keys text \
     --tokenizer-type ByteTokenizer --output-prefix corpus --append-eod; then
  if run bytetrain "$LATTICE" train "${TINY[@]}" --data-path corpus_text_document \
       --tokenizer-type ByteTokenizer --save byteckpt --metrics-file byte.jsonl; then
    run gen1 "$LATTICE" generate --load byteckpt --prompt "ab" --max-new-tokens 5 --seed 3
    run gen2 "$LATTICE" generate --load byteckpt --prompt "ab" --max-new-tokens 5 --seed 3
    if [ ! -s gen1.out ]; then
      fail "generate printed nothing"
    elif ! cmp -s gen1.out gen2.out; then
      fail "generate with the same --seed gives different output: $(od -c gen1.out) vs $(od -c gen2.out)"
    elif [ "$(head -c 2 gen1.out)" != "ab" ]; then
      fail "generate output does not start with the prompt: $(od -c gen1.out | head -n 2)"
    else
      pass "generate is deterministic for a fixed --seed"
    fi
    # --bf16: the weights read as bf16 (the same prompt, a bf16 model's numbers), with the KV cache only.
    if run gen_bf16 "$LATTICE" generate --load byteckpt --prompt "ab" --max-new-tokens 5 --seed 3 --bf16 &&
       [ "$(head -c 2 gen_bf16.out)" = "ab" ] && grep -q "KV cache, bf16 weights" gen_bf16.err; then
      pass "generate --bf16 decodes with bf16 weights"
    else
      fail "generate --bf16: $(cat gen_bf16.err | tail -n 2)"
    fi
    expect_error "generate --bf16 without the KV cache" "--bf16 decodes with the KV cache" -- \
      "$LATTICE" generate --load byteckpt --prompt "ab" --bf16 --no-kv-cache

    if run plot "$LATTICE" plot --metrics-file byte.jsonl --output byte.svg; then
      if [ -s byte.svg ] && grep -q '<svg' byte.svg && grep -q '</svg>' byte.svg; then
        pass "plot wrote an SVG"
      else
        fail "plot did not write an SVG to byte.svg"
      fi
    fi
  fi
fi

# ---- --data-args-path / --per-split-data-args-path: the data paths from files ----
# The same run as --data-path corpus_text_document (the prefix on a line of its own) and as
# --train-data-path/--valid-data-path from a JSON file: the losses of the command-line paths.
if [ -s byte.jsonl ]; then
  printf '\n  corpus_text_document\n' >blend.txt
  printf '{"train": ["corpus_text_document"], "valid": "corpus_text_document"}\n' >splits.json
  if run argsfile "$LATTICE" train "${TINY[@]}" --data-args-path blend.txt --tokenizer-type ByteTokenizer \
       --metrics-file argsfile.jsonl &&
     run splitfile "$LATTICE" train "${TINY[@]}" --per-split-data-args-path splits.json --tokenizer-type ByteTokenizer \
       --metrics-file splitfile.jsonl &&
     run splitcli "$LATTICE" train "${TINY[@]}" --train-data-path corpus_text_document \
       --valid-data-path corpus_text_document --tokenizer-type ByteTokenizer --metrics-file splitcli.jsonl; then
    [ "$(losses argsfile.jsonl)" = "$(losses byte.jsonl)" ] && [ -n "$(losses splitfile.jsonl)" ] &&
      [ "$(losses splitfile.jsonl)" = "$(losses splitcli.jsonl)" ] &&
      pass "--data-args-path and --per-split-data-args-path train as their paths on the command line" ||
      fail "data paths from files: $(losses argsfile.jsonl | tr '\n' ' ') / $(losses byte.jsonl | tr '\n' ' '); \
$(losses splitfile.jsonl | tr '\n' ' ') / $(losses splitcli.jsonl | tr '\n' ' ')"
  fi
  expect_error "--data-args-path missing" "--data-args-path|nothing.txt|cannot open" -- \
    "$LATTICE" train "${TINY[@]}" --data-args-path nothing.txt --tokenizer-type ByteTokenizer
  # Two datasets without weights (Megatron's blend by size: one epoch of each).
  printf 'corpus_text_document\ncorpus_text_document\n' >two.txt
  run twolisted "$LATTICE" train "${TINY[@]}" --data-args-path two.txt --tokenizer-type ByteTokenizer &&
    grep -q ' > train: the 2 datasets blended by their sizes, 12 samples' twolisted.out &&
    pass "datasets without weights are blended by their sizes" ||
    fail "datasets without weights: $(grep '> train' twolisted.out | tr '\n' ' ')"
  printf '{"train": "corpus_text_document", "validation": "corpus_text_document"}' >badsplits.json
  expect_error "--per-split-data-args-path unknown key" "--per-split-data-args-path|badsplits.json|validation" -- \
    "$LATTICE" train "${TINY[@]}" --per-split-data-args-path badsplits.json --tokenizer-type ByteTokenizer
fi

# ---- the precision-aware optimizer: Adam's moments in bf16 ----
# Half the optimizer state (12 bytes per parameter instead of 16), a run that resumes from its
# checkpoint (the moments saved in fp32, read back exactly) logging the uninterrupted run's losses,
# and Megatron's dtype flags refused where lattice has no such state.
PA=(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
TINY6=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
       --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --lr 1e-3 --min-lr 1e-4 --log-interval 1
       --seed 1234 --eval-iters 0)
if run pa_straight "$LATTICE" train "${TINY6[@]}" "${MOCK[@]}" "${PA[@]}" --metrics-file pa_straight.jsonl &&
   run pa_first "$LATTICE" train "${TINY6[@]}" "${MOCK[@]}" "${PA[@]}" --exit-interval 3 --save pa_ckpt &&
   run pa_resumed "$LATTICE" train "${TINY6[@]}" "${MOCK[@]}" "${PA[@]}" --load pa_ckpt \
     --metrics-file pa_resumed.jsonl; then
  grep -q "optimizer state .*; 12.00 bytes per parameter" pa_straight.out ||
    fail "bf16 moments: the memory line does not say 12 bytes per parameter: $(grep 'memory per rank' pa_straight.out)"
  if [ "$(losses pa_resumed.jsonl)" = "$(losses pa_straight.jsonl | tail -n 3)" ]; then
    pass "bf16 moments: a resumed run logs the uninterrupted run's last 3 losses"
  else
    fail "bf16 moments: resumed $(losses pa_resumed.jsonl | tr '\n' ' ') vs straight $(losses pa_straight.jsonl | tr '\n' ' ')"
  fi
fi
expect_error "--exp-avg-dtype bf16 alone" "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer" -- \
  "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" --exp-avg-dtype bf16
expect_error "--exp-avg-sq-dtype fp8" "--exp-avg-sq-dtype fp8 is not implemented" -- \
  "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" --use-precision-aware-optimizer --exp-avg-sq-dtype fp8
expect_error "--main-grads-dtype bf16" "--main-grads-dtype bf16 is not implemented" -- \
  "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" --use-precision-aware-optimizer --main-grads-dtype bf16
expect_error "--exp-avg-dtype int8" "--exp-avg-dtype must be one of fp32, fp16, bf16, fp8, got 'int8'" -- \
  "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" --use-precision-aware-optimizer --exp-avg-dtype int8
expect_error "precision-aware SGD" "--use-precision-aware-optimizer needs --optimizer adam" -- \
  "$LATTICE" train "${TINY[@]}" "${MOCK[@]}" --use-precision-aware-optimizer --optimizer sgd

e2e_finish
