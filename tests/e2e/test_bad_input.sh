#!/usr/bin/env bash
# Bad input to the lattice CLI: every mistake a user can make must end in a non-zero exit and ONE
# line on stderr that names the problem (the flag or file, and what is wrong with it), and must
# leave no partial output behind.
#   bash tests/e2e/test_bad_input.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

# A tiny model; each case adds the rest (repeating a flag is itself an error, so MODEL has no
# --num-layers and no data flags).
MODEL=(--hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
       --micro-batch-size 2 --train-iters 3 --lr 1e-3 --eval-iters 0)
MOCK=(--mock-data --vocab-size 64)

# ---- lattice train: flags ----
expect_error "unknown flag" "--bogus-flag|unknown" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" "${MOCK[@]}" --bogus-flag
expect_error "missing value" "--num-layers|value" -- \
  "$LATTICE" train "${MODEL[@]}" "${MOCK[@]}" --num-layers
expect_error "non-numeric value" "--num-layers|abc" -- \
  "$LATTICE" train --num-layers abc "${MODEL[@]}" "${MOCK[@]}"
expect_error "heads do not divide hidden size" "--num-attention-heads|--hidden-size|divide" -- \
  "$LATTICE" train --num-layers 1 --hidden-size 30 --num-attention-heads 4 --seq-length 16 \
  --micro-batch-size 2 --train-iters 3 --lr 1e-3 "${MOCK[@]}"
expect_error "global batch not a multiple of micro batch" "--global-batch-size|--micro-batch-size|multiple" -- \
  "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 \
  --micro-batch-size 3 --global-batch-size 8 --train-iters 3 --lr 1e-3 "${MOCK[@]}"
expect_error "seq-length > max-position-embeddings" "--seq-length|--max-position-embeddings|exceed" -- \
  "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 \
  --max-position-embeddings 16 --micro-batch-size 2 --train-iters 3 --lr 1e-3 "${MOCK[@]}"
expect_error "no data" "data|--data-path|--mock-data" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --vocab-size 64
expect_error "unknown tokenizer (with --vocab-size)" "--tokenizer-type|FooTokenizer|unknown" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" "${MOCK[@]}" --tokenizer-type FooTokenizer
# Without --vocab-size the tokenizer is the only source of the vocabulary: the error must still
# be about the unknown tokenizer, not about a missing vocabulary size.
expect_error "unknown tokenizer (no --vocab-size)" "--tokenizer-type|FooTokenizer|unknown" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --mock-data --tokenizer-type FooTokenizer

# ---- lattice train: datasets ----
expect_error "missing dataset prefix" "$TMP/nope|no such file" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --data-path "$TMP/nope" --vocab-size 64

# A good ByteTokenizer dataset (token ids up to 256) to break in various ways.
printf '%s\n' '{"text": "hello world"}' '{"text": "abc"}' \
  '{"text": "the quick brown fox jumps over the lazy dog"}' > good.jsonl
if ! "$LATTICE" preprocess --input good.jsonl --json-keys text --tokenizer-type ByteTokenizer \
     --output-prefix good --append-eod 2>preprocess.err; then
  fail "preprocess of a good jsonl failed: $(cat preprocess.err)"
fi
if [ ! -s good_text_document.bin ] || [ ! -s good_text_document.idx ]; then
  fail "preprocess did not write good_text_document.{bin,idx}"
fi
# The good dataset trains (the cases below fail because of the damage, not something else).
if ! "$LATTICE" train --num-layers 1 "${MODEL[@]}" --data-path good_text_document \
     --tokenizer-type ByteTokenizer >train.out 2>train.err; then
  fail "training on the good dataset failed: $(cat train.err)"
fi

# Corrupt .idx: wrong magic.
cp good_text_document.bin corrupt.bin
cp good_text_document.idx corrupt.idx
printf 'NOTANIDX!' | dd of=corrupt.idx conv=notrunc status=none
expect_error "corrupt .idx (wrong magic)" "corrupt.idx|magic" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --data-path corrupt --tokenizer-type ByteTokenizer

# Truncated .bin.
cp good_text_document.idx trunc.idx
head -c 50 good_text_document.bin > trunc.bin
expect_error "truncated .bin" "trunc.bin|truncated" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --data-path trunc --tokenizer-type ByteTokenizer

# Token ids >= the vocabulary: ByteTokenizer ids ('h' = 104) with --vocab-size 100.
expect_error "token id outside the vocabulary" "good_text_document.bin|token|104|100" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --data-path good_text_document --vocab-size 100

# ---- lattice preprocess ----
PRE=(--json-keys text --tokenizer-type ByteTokenizer --append-eod)
printf '%s\n' '{"text": "fine"}' '{"text": not json' '{"text": "fine too"}' > malformed.jsonl
expect_error "preprocess: malformed JSON" "malformed.jsonl|line 2|json" -- \
  "$LATTICE" preprocess --input malformed.jsonl --output-prefix out_malformed "${PRE[@]}"
printf '%s\n' '{"text": "fine"}' '{"body": "no text key"}' > missingkey.jsonl
expect_error "preprocess: missing key" "missingkey.jsonl|line 2|text|missing" -- \
  "$LATTICE" preprocess --input missingkey.jsonl --output-prefix out_missingkey "${PRE[@]}"
expect_error "preprocess: missing input" "absent.jsonl" -- \
  "$LATTICE" preprocess --input absent.jsonl --output-prefix out_absent "${PRE[@]}"
# With two workers the error is the same.
expect_error "preprocess --workers 2: malformed JSON" "malformed.jsonl|line 2|json" -- \
  "$LATTICE" preprocess --input malformed.jsonl --output-prefix out_malformed2 "${PRE[@]}" --workers 2
for p in out_malformed out_missingkey out_absent out_malformed2; do
  leftovers=$(ls -d "$p"* 2>/dev/null)
  if [ -n "$leftovers" ]; then
    fail "failed preprocess left output files behind: $leftovers"
  else
    pass "no output files after a failed preprocess ($p)"
  fi
done

# A failed run with the prefix of an existing good dataset must not touch it.
before=$(sha256sum good_text_document.bin good_text_document.idx)
expect_error "preprocess over an existing dataset: malformed JSON" "malformed.jsonl|line 2" -- \
  "$LATTICE" preprocess --input malformed.jsonl --output-prefix good "${PRE[@]}"
expect_error "preprocess over an existing dataset: missing key" "missingkey.jsonl|line 2" -- \
  "$LATTICE" preprocess --input missingkey.jsonl --output-prefix good "${PRE[@]}"
after=$(sha256sum good_text_document.bin good_text_document.idx)
if [ "$before" != "$after" ]; then
  fail "a failed preprocess modified the existing dataset good_text_document.{bin,idx}"
else
  pass "existing dataset unchanged by a failed preprocess with the same prefix"
fi
extra=$(ls -A | grep '^good' | grep -v -x -e good.jsonl -e good_text_document.bin -e good_text_document.idx)
if [ -n "$extra" ]; then
  fail "a failed preprocess left files next to the dataset: $extra"
fi

# ---- lattice generate ----
expect_error "generate: missing --load dir" "$TMP/no_checkpoint" -- \
  "$LATTICE" generate --load "$TMP/no_checkpoint" --prompt ab --max-new-tokens 2
if [ -e "$TMP/no_checkpoint" ]; then
  fail "generate created the missing --load dir $TMP/no_checkpoint"
fi

# ---- a nonexistent output is not created by a failing train ----
expect_error "train fails before writing --save/--metrics-file" "--bogus-flag" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" "${MOCK[@]}" --save "$TMP/ckpt_never" \
  --metrics-file "$TMP/metrics_never.jsonl" --bogus-flag
expect_error "train with bad data does not write --save/--metrics-file" "corrupt.idx|magic" -- \
  "$LATTICE" train --num-layers 1 "${MODEL[@]}" --data-path corrupt --tokenizer-type ByteTokenizer \
  --save "$TMP/ckpt_never" --metrics-file "$TMP/metrics_never.jsonl"
for p in "$TMP/ckpt_never" "$TMP/metrics_never.jsonl"; do
  if [ -e "$p" ]; then fail "a failed train created $p"; else pass "failed train did not create $(basename "$p")"; fi
done

# ---- lattice train: more than the machine holds ----
# The logits of 2 x 2^20 tokens over a 65536-token vocabulary (0.5 TB): an error naming the
# buffer and what to change, never the OOM killer.
expect_error "activations larger than the machine" "the activations (micro-batch 2 x 1048576 tokens|out of memory|--micro-batch-size|--recompute-granularity" -- \
  "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 1048576 \
  --max-position-embeddings 1048576 --micro-batch-size 2 --train-iters 1 --lr 1e-3 --eval-iters 0 \
  --mock-data --vocab-size 65536 --save "$TMP/ckpt_oom"
[ -e "$TMP/ckpt_oom" ] && fail "a train out of memory created its --save directory" ||
  pass "out of memory: no --save directory"

# ---- top level ----
rc=0
"$LATTICE" bogus-command >/dev/null 2>top.err || rc=$?
if [ "$rc" -eq 0 ]; then
  fail "'lattice bogus-command' exited 0"
elif ! grep -qF "bogus-command" top.err; then
  fail "'lattice bogus-command' does not name the command on stderr: $(cat top.err)"
else
  pass "unknown command: exit $rc, $(head -n 1 top.err)"
fi

e2e_finish
