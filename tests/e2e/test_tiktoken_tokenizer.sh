#!/usr/bin/env bash
# TikTokenizer (Megatron's: --tokenizer-type TikTokenizer --tokenizer-model vocab.json --tiktoken-pattern
# v1|v2 ...) against OpenAI's tiktoken given the same ranks and pattern (tiktoken_reference.cjs), on
# a vocabulary made from cl100k_base in Megatron's format (the 256 bytes first, then cl100k's longer
# tokens): the same ids on the vectors and on the whole King James Bible with both patterns, with
# the whole vocabulary and with one cut to 20,000 ranks, with Megatron's special-token layout; decode
# inverts encode; `preprocess` writes Megatron's .bin/.idx byte for byte; a trained model generates
# with the tokenizer its checkpoint recorded; bad vocabularies and flags give one-line errors and
# leave nothing behind. No node, npm or registry: FAIL, not skip.
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

NPM_DIR=${LATTICE_NPM_DIR:-$(dirname "$LATTICE")/npm}
if ! "$SRC/scripts/install-tokenizer-assets.sh" "$NPM_DIR" >/dev/null; then
  echo "FAIL: the reference tokenizers are not available in $NPM_DIR" >&2
  exit 1
fi
command -v bible >/dev/null || { echo "FAIL: 'bible' not found (scripts/install-deps.sh installs bible-kjv)" >&2; exit 1; }
cd "$TMP" || exit 1
ref() { node "$SRC/tests/e2e/tiktoken_reference.cjs" "$NPM_DIR" "$@"; }
ref vocab vocab.json || { fail "tiktoken_reference.cjs vocab failed"; e2e_finish; }
bible -f "gen1:1-rev22:21" >kjv.txt
VECTORS="$SRC/tests/fixtures/tokenizer_vectors.jsonl"

# 1. Vectors and the KJV: (pattern, special ids, vocabulary size, special tokens).
for v in "v2|1000|101256|" "v1|1000|101256|" "v1|16|20016|<unk> <s> </s> <mask> <pad>"; do
  IFS='|' read -r pattern S V specials <<<"$v"
  TT=(--tokenizer-type TikTokenizer --tokenizer-model vocab.json --tiktoken-pattern "$pattern"
      --tiktoken-num-special-tokens "$S" --vocab-size "$V")
  [ -n "$specials" ] && TT+=(--tiktoken-special-tokens "$specials")
  name="$pattern, $S special ids, vocabulary $V${specials:+, specials $specials}"
  if ref ids vocab.json "$pattern" "$S" "$V" "$specials" vectors "$VECTORS" >vec.ref &&
     "$LATTICE" tokenize --jsonl "${TT[@]}" <"$VECTORS" >vec.out; then
    cmp -s vec.ref vec.out && pass "$name: $(line_count "$VECTORS") vectors, same ids as tiktoken's" ||
      { fail "$name: vectors differ from tiktoken's (line: vector):"; diff vec.ref vec.out | head -n 10 >&2; }
  else
    fail "$name: vectors: reference or lattice failed"
  fi
  ref ids vocab.json "$pattern" "$S" "$V" "$specials" text kjv.txt >kjv.ref &&
    "$LATTICE" tokenize "${TT[@]}" <kjv.txt >kjv.ids && cmp -s kjv.ref kjv.ids &&
    pass "$name: whole KJV text ($(wc -w <kjv.ids) tokens), same ids as tiktoken's" ||
    fail "$name: KJV ids differ from tiktoken's: $(cmp kjv.ref kjv.ids 2>&1 | head -n 1)"
  "$LATTICE" tokenize --decode "${TT[@]}" <kjv.ids >kjv.back && cmp -s kjv.txt kjv.back &&
    pass "$name: decode(encode(KJV)) == KJV" || fail "$name: decode(encode(KJV)) is not the KJV"
done
TT=(--tokenizer-type TikTokenizer --tokenizer-model vocab.json --tiktoken-pattern v2 --vocab-size 101256)
got=$(printf '</s><s>' | "$LATTICE" tokenize --append-eod "${TT[@]}")
first=$(printf '</s><s>' | ref ids vocab.json v2 1000 101256 "" text /dev/stdin)
[ "$got" = "$first 2" ] && pass "special tokens in the text are text; --append-eod adds </s> = 2: $got" ||
  fail "'</s><s>' with --append-eod: got '$got', want '$first 2'"
got=$(printf '0 1 2 3 999' | "$LATTICE" tokenize --decode "${TT[@]}")
[ "$got" = "<unk><s></s><SPECIAL_3><SPECIAL_999>" ] &&
  pass "ids 0..999 are the special tokens, <SPECIAL_k> after the given ones: $got" || fail "special ids decode as '$got'"

# 2. preprocess: Megatron's files (int32 ids), 1 and 2 workers.
"$SRC/scripts/kjv-to-jsonl.sh" kjv.jsonl >/dev/null
for w in 1 2; do
  "$LATTICE" preprocess --input kjv.jsonl --json-keys text "${TT[@]}" --output-prefix kjv$w --append-eod \
    --workers $w --no-progress 2>pre.log || fail "preprocess --workers $w failed: $(cat pre.log)"
done
out=$(ref ids vocab.json v2 1000 101256 "" dataset kjv.jsonl kjv2_text_document 2>&1) &&
  pass "preprocess KJV --workers 2: $out" || fail "preprocess KJV --workers 2: $out"
cmp -s kjv1_text_document.bin kjv2_text_document.bin && cmp -s kjv1_text_document.idx kjv2_text_document.idx &&
  pass "preprocess: --workers 1 and 2 give the same bytes" || fail "preprocess: --workers 1 and 2 differ"

# 3. Train with it; generate uses the checkpoint's tokenizer flags.
if "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
     --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-3 --log-interval 1 --eval-iters 0 \
     --data-path kjv1_text_document --split 100,0,0 "${TT[@]}" --save ckpt >train.out 2>&1 &&
   "$LATTICE" generate --load ckpt --prompt "In the beginning" --max-new-tokens 8 --temperature 0 >gen.out 2>gen.err &&
   grep -q '^In the beginning' gen.out; then
  pass "train --tokenizer-type TikTokenizer, generate from its checkpoint: $(head -c 60 gen.out | tr '\n' ' ')"
else
  fail "train or generate with TikTokenizer failed: $(tail -n 3 train.out) $(cat gen.err 2>/dev/null)"
fi

# 4. Bad vocabularies and flags: one line naming the file or the flag; nothing written.
node -e 'const fs = require("fs"); const v = JSON.parse(fs.readFileSync("vocab.json"));
  const w = (f, x) => fs.writeFileSync(f, JSON.stringify(x));
  w("rank.json", v.map((e, i) => (i === 300 ? { ...e, rank: 7 } : e)));
  w("bytes.json", [v[1], v[0], ...v.slice(2)].map((e, i) => ({ ...e, rank: i })));
  w("object.json", { vocab: v });
  w("dup.json", v.map((e, i) => (i === 400 ? { ...e, token_bytes: v[300].token_bytes } : e)));'
head -c 4000 vocab.json >cut.json
expect_error "an entry out of rank order" "--tokenizer-model|rank.json|entry 300|rank" -- \
  "$LATTICE" preprocess --input kjv.jsonl "${TT[@]/vocab.json/rank.json}" --output-prefix failed
expect_error "the first 256 not the bytes in order" "bytes.json|entry 0|single bytes" -- \
  "$LATTICE" tokenize "${TT[@]/vocab.json/bytes.json}"
expect_error "not a list" "object.json|JSON list" -- "$LATTICE" tokenize "${TT[@]/vocab.json/object.json}"
expect_error "a repeated token" "dup.json|entry 400|repeats" -- "$LATTICE" tokenize "${TT[@]/vocab.json/dup.json}"
expect_error "truncated vocabulary" "cut.json|not valid JSON" -- "$LATTICE" tokenize "${TT[@]/vocab.json/cut.json}"
expect_error "fewer tokens than the vocabulary size" "vocab.json|100256 tokens|--vocab-size 200000" -- \
  "$LATTICE" tokenize --tokenizer-type TikTokenizer --tokenizer-model vocab.json --tiktoken-pattern v1 --vocab-size 200000
expect_error "no --tiktoken-pattern" "--tiktoken-pattern|required" -- \
  "$LATTICE" tokenize --tokenizer-type TikTokenizer --tokenizer-model vocab.json
expect_error "--tiktoken-pattern v3" "--tiktoken-pattern|v1 or v2|v3" -- \
  "$LATTICE" tokenize --tokenizer-type TikTokenizer --tokenizer-model vocab.json --tiktoken-pattern v3
expect_error "special tokens without </s>" "--tiktoken-special-tokens|</s>" -- \
  "$LATTICE" tokenize "${TT[@]}" --tiktoken-special-tokens "<unk> <s>"
expect_error "--tiktoken-pattern with ByteTokenizer" "--tiktoken-pattern|does not apply" -- \
  "$LATTICE" tokenize --tokenizer-type ByteTokenizer --tiktoken-pattern v1
ls -d failed* >/dev/null 2>&1 && fail "a failed run left files: $(ls -d failed*)" || pass "failed runs left no files"

e2e_finish
