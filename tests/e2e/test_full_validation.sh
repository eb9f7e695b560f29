#!/usr/bin/env bash
# --full-validation (Megatron's): every evaluation reads the whole validation split, one epoch, from
# its first sample. Its loss equals an --eval-iters evaluation over the same samples; a split that is
# not a multiple of the global batch (a short last batch and micro-batch) gives the same loss under
# tensor, sequence, pipeline, context and data parallelism as in one process; --eval-iters then
# sizes the test split only; --mock-data and a blend of several datasets are one-line errors.
#   bash tests/e2e/test_full_validation.sh <lattice> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

for i in $(seq 1 60); do
  printf '{"text": "line %d: the quick brown fox jumps over the lazy dog %d times"}\n' "$i" "$((i * 7))"
done >corpus.jsonl
"$LATTICE" preprocess --input corpus.jsonl --json-keys text --tokenizer-type ByteTokenizer \
  --output-prefix corpus --append-eod >prep.log 2>&1 || { fail "preprocess: $(tail -n 2 prep.log)"; e2e_finish; }
BASE=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --max-position-embeddings 32
      --micro-batch-size 2 --global-batch-size 4 --log-interval 1 --seed 1234
      --hidden-dropout 0 --attention-dropout 0 --tokenizer-type ByteTokenizer --data-path corpus_text_document)

# val_losses FILE: the metrics file's validation losses, one per line
val_losses() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }

# ---- the same samples as an --eval-iters evaluation ----
# --seq-length 17: the valid split (sequences [48, 60)) is 44 samples, 11 global batches. With
# --train-iters below --eval-interval the run evaluates once, at the end, from validation sample 0,
# and the --eval-iters 11 run's split is one epoch too: the same samples in the same order.
SAME=("${BASE[@]}" --lr 1e-3 --seq-length 17 --split 80,20,0 --train-iters 3 --eval-interval 5)
if run whole "$LATTICE" "${SAME[@]}" --full-validation --eval-iters 0 && run iters "$LATTICE" "${SAME[@]}" --eval-iters 11; then
  want=$(grep 'on validation set' iters.out) got=$(grep 'on validation set' whole.out)
  grep -q ' > valid: corpus_text_document sequences \[48, 60), 44 samples' whole.out ||
    fail "the whole split is not the 44 samples of one epoch: $(grep '> valid' whole.out)"
  if [ -n "$got" ] && [ "$got" = "$want" ]; then
    pass "the whole split's loss is that of --eval-iters 11 over its 44 samples: $(echo "$got" | cut -c1-90)"
  else
    fail "--full-validation '$got' against --eval-iters 11 '$want'"
  fi
fi

# ---- a short last batch, every layout ----
# --seq-length 16: 47 samples, 11 global batches of 4 and one of 3 (micro-batches of 2 and 1).
# Evaluations at iterations 2 and 4 and after training; --split 80,10,10 has a test split,
# evaluated on --eval-iters 1 batch.
SHORT0=("${BASE[@]}" --seq-length 16 --split 80,10,10 --train-iters 4 --eval-interval 2 --eval-iters 1 --full-validation)
SHORT=("${SHORT0[@]}" --lr 1e-3)
if run one "$LATTICE" "${SHORT[@]}" --metrics-file one.jsonl; then
  grep -q ' > valid: corpus_text_document sequences \[48, 54), ' one.out ||
    fail "unexpected validation split: $(grep '> valid' one.out)"
  [ "$(val_losses one.jsonl | wc -l)" = 3 ] && grep -q '"test_loss"' one.jsonl ||
    fail "expected 3 validation losses and a test loss: $(cat one.jsonl | grep -c val_loss)"
  if command -v mpirun >/dev/null 2>&1; then
    MPI=(mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE")
    for layout in "--tensor-model-parallel-size 2 --sequence-parallel" "--pipeline-model-parallel-size 2" \
                  "--context-parallel-size 2" ""; do
      name="layout ${layout:-data parallel 2}"
      rm -f two.jsonl
      run two "${MPI[@]}" "${SHORT[@]}" $layout --metrics-file two.jsonl || continue
      if paste <(val_losses two.jsonl) <(val_losses one.jsonl) |
         awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) bad = 1; k++ } END { exit bad || k != 3 }'; then
        pass "$name: the 3 whole-split losses of one process"
      else
        fail "$name: $(val_losses two.jsonl | tr '\n' ' ') against $(val_losses one.jsonl | tr '\n' ' ')"
      fi
    done
  else
    echo "skipped: the layouts (no mpirun)"
  fi
fi

# ---- every evaluation from the first sample ----
# With --lr 0 the model never changes: the whole split gives one loss at every evaluation (an
# --eval-iters evaluation moves on to new samples each time).
if run frozen "$LATTICE" "${SHORT0[@]}" --lr 0 --min-lr 0 --metrics-file frozen.jsonl &&
   run moving "$LATTICE" "${BASE[@]}" --seq-length 16 --split 80,10,10 --train-iters 4 --eval-interval 2 \
     --eval-iters 1 --lr 0 --min-lr 0 --metrics-file moving.jsonl; then
  [ "$(val_losses frozen.jsonl | sort -u | wc -l)" = 1 ] && [ "$(val_losses moving.jsonl | head -n 2 | sort -u | wc -l)" = 2 ] &&
    pass "each evaluation reads the split from its first sample" ||
    fail "whole-split losses $(val_losses frozen.jsonl | tr '\n' ' '), --eval-iters losses $(val_losses moving.jsonl | tr '\n' ' ')"
fi

# ---- refused ----
cp corpus_text_document.bin other_text_document.bin && cp corpus_text_document.idx other_text_document.idx
ERR=(train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 32
     --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --tokenizer-type ByteTokenizer --full-validation)
expect_error "--full-validation with --mock-data" "--full-validation|--mock-data" -- "$LATTICE" "${ERR[@]}" --mock-data
expect_error "--full-validation of a blend" "--full-validation|blends 2 datasets|--data-path" -- \
  "$LATTICE" "${ERR[@]}" --data-path 1 corpus_text_document 1 other_text_document
expect_error "--full-validation of a validation blend" "--full-validation|--valid-data-path" -- \
  "$LATTICE" "${ERR[@]}" --train-data-path corpus_text_document --valid-data-path 1 corpus_text_document 1 other_text_document

e2e_finish
