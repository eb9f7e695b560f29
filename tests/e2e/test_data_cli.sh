#!/usr/bin/env bash
# lattice data samples / info as a user runs them: Megatron's public sample-order vector
# through the CLI, the greedy blending order, the index cache (reuse, corruption), and
# bad input (missing .idx, a split with no samples, a blend weight <= 0, bad flags).
#   bash tests/e2e/test_data_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

# jsonl with one document per size, document i = letter i repeated size times (no EOD),
# so each ByteTokenizer token names its document: sequence i has tokens 65+i.
make_data() {  # make_data NAME FIRST_LETTER_CODE SIZE...
  local name=$1 code=$2
  shift 2
  : >"$name.jsonl"
  for n in "$@"; do
    printf '{"text": "%s"}\n' "$(printf "\\$(printf '%03o' "$code")%.0s" $(seq "$n"))" >>"$name.jsonl"
    code=$((code + 1))
  done
  "$LATTICE" preprocess --input "$name.jsonl" --output-prefix "$name" --tokenizer-type ByteTokenizer \
    >/dev/null 2>&1 || fail "preprocess $name"
}

# The public vector (reference/megatron.md): sizes [5,3,7,2,6,4,9,1,8,5], S=8, 5 samples,
# seed 1234: shuffle index [5,0,3,4,2,1]; sample 0 = sequence 6 [1:9] + sequence 3 [0:1].
make_data pub 65 5 3 7 2 6 4 9 1 8 5
P=pub_text_document
if "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 5 --seed 1234 >pub.out 2>pub.err; then
  [ "$(line_count pub.out)" -eq 5 ] || fail "expected 5 sample lines, got $(line_count pub.out)"
  [ "$(head -n 1 pub.out)" = "[71,71,71,71,71,71,71,71,68]" ] ||
    fail "sample 0 is $(head -n 1 pub.out), expected sequence 6 [1:9] + sequence 3 [0:1]"
  # Every line is a JSON list of S+1 = 9 ids.
  bad=$(grep -cvE '^\[([0-9]+,){8}[0-9]+\]$' pub.out)
  [ "$bad" -eq 0 ] || fail "$bad sample lines are not lists of 9 token ids"
  [ -s pub.err ] && fail "data samples wrote to stderr: $(head -n 1 pub.err)"
  pass "data samples reproduces Megatron's public sample-order vector"
else
  fail "data samples exited non-zero: $(head -n 1 pub.err)"
fi

# The index cache: written under the data directory, reused with the same output; a
# corrupted cache is reported on stderr, rebuilt, and the samples do not change.
cache=$(ls cache/GPTDataset_indices/*-GPTDataset-train-indices.bin 2>/dev/null | head -n 1)
if [ -z "$cache" ]; then
  fail "no index cache under cache/GPTDataset_indices"
else
  "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 5 >again.out 2>again.err
  cmp -s pub.out again.out || fail "second run (cache hit) prints other samples"
  [ -s again.err ] && fail "cache hit wrote to stderr: $(head -n 1 again.err)"
  size=$(stat -c %s "$cache")
  printf '\377\377\377\377' | dd of="$cache" bs=1 seek=$((size - 6)) conv=notrunc status=none
  "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 5 >corrupt.out 2>corrupt.err
  cmp -s pub.out corrupt.out || fail "after corrupting the cache the samples changed"
  grep -q "invalid" corrupt.err || fail "a corrupted index cache was not reported"
  mkdir -p elsewhere
  "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 5 --data-cache-path elsewhere >dc.out 2>&1
  [ "$(ls elsewhere | wc -l)" -eq 1 ] || fail "--data-cache-path did not receive the index cache"
  pass "index cache reused, corruption detected and rebuilt, --data-cache-path honoured"
fi

# The sample order depends on the count the split is built for: --train-iters/--global-batch-size
# build it as training does (12 samples), and the first 5 then differ from a 5-sample build.
"$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 12 >twelve.out 2>&1 || fail "12 samples"
"$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 5 --train-iters 3 --global-batch-size 4 \
  >train5.out 2>&1 || fail "samples with --train-iters"
[ "$(head -n 5 twelve.out)" = "$(cat train5.out)" ] || fail "--train-iters 3 --global-batch-size 4 is not the 12-sample build"

# Blending: three datasets (letters a.., j.., s..), weights .5/.25/.25: Megatron's greedy
# order [0,1,2,0,0,1,2,0]; the first token of each sample names its dataset.
make_data ba 97 9 9 9 9 9 9 9 9 9
make_data bb 106 9 9 9 9 9 9 9 9 9
make_data bc 115 9 9 9 9 9 9 9 9
if "$LATTICE" data samples --data-path 0.5 ba_text_document 0.25 bb_text_document 0.25 bc_text_document \
     --seq-length 4 --num-samples 8 --split 1 >blend.out 2>blend.err; then
  order=$(sed -E 's/^\[([0-9]+),.*/\1/' blend.out | awk '{ print ($1 >= 115) ? 2 : ($1 >= 106) ? 1 : 0 }' | tr -d '\n')
  [ "$order" = "01200120" ] || fail "blend order $order, expected 01200120"
  pass "blending follows Megatron's greedy order"
else
  fail "blended data samples exited non-zero: $(head -n 1 blend.err)"
fi

# info
if "$LATTICE" data info --data-path $P --seq-length 8 >info.out 2>&1; then
  for pat in "dtype: uint16" "documents: 10" "sequences: 10" "tokens: 50" "split train"; do
    grep -qF "$pat" info.out || fail "data info lacks '$pat'"
  done
  pass "data info summarises the dataset"
else
  fail "data info exited non-zero: $(head -n 1 info.out)"
fi

# Bad input: one line naming the file/flag, non-zero exit.
cp $P.bin noidx.bin
expect_error "missing .idx" "noidx.idx" -- "$LATTICE" data samples --data-path noidx --seq-length 8 --num-samples 2
expect_error "split with no samples" "valid split|no tokens" -- \
  "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 2 --split-name valid
expect_error "blend weight 0" "--data-path|weight 0" -- \
  "$LATTICE" data samples --data-path 1 $P 0 $P --seq-length 8 --num-samples 2
expect_error "negative blend weight" "--data-path|weight -1" -- \
  "$LATTICE" data samples --data-path -1 $P 1 $P --seq-length 8 --num-samples 2
expect_error "malformed split" "--split" -- \
  "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 2 --split 9,x
expect_error "bad split name" "--split-name" -- \
  "$LATTICE" data samples --data-path $P --seq-length 8 --num-samples 2 --split-name dev
expect_error "unknown flag" "--bogus" -- "$LATTICE" data samples --data-path $P --bogus 1
expect_error "missing seq-length" "--seq-length" -- "$LATTICE" data samples --data-path $P --num-samples 2
expect_error "no subcommand" "data samples" -- "$LATTICE" data

e2e_finish
