#!/usr/bin/env bash
# Megatron's SentencePiece tokenizers (--tokenizer-type SentencePieceTokenizer, GPTSentencePieceTokenizer,
# Llama2Tokenizer --tokenizer-model tokenizer.model) against Megatron's Python classes written over
# Google's sentencepiece module (sentencepiece_reference.py), on two models trained here by spm_train:
# Llama 2's settings (BPE, byte fallback, digits split, no normalization) and T5's (unigram, NFKC,
# pad 0, eos 1, no bos). The same ids on the vectors (special tokens included) and on the whole
# King James Bible; the same decoded text; `preprocess` writes Megatron's .bin/.idx byte for byte;
# a model trained with Llama2Tokenizer generates from text, its HF export carries tokenizer.model,
# and a HuggingFace folder with tokenizer.model converts as Llama2Tokenizer; bad models give
# one-line errors and leave nothing behind. No spm_train or Python module: FAIL, not skip.
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

PY=/usr/bin/python3
if ! command -v spm_train >/dev/null || ! "$PY" -c 'import sentencepiece' 2>/dev/null; then
  echo "FAIL: spm_train or Python's sentencepiece is missing (scripts/install-deps.sh installs sentencepiece" >&2
  echo "      and python3-sentencepiece)" >&2
  exit 1
fi
command -v bible >/dev/null || { echo "FAIL: 'bible' not found (scripts/install-deps.sh installs bible-kjv)" >&2; exit 1; }
cd "$TMP" || exit 1
bible -f "gen1:1-rev22:21" >kjv.txt
head -c 500000 kjv.txt >kjv_part.txt
SPM=(--num_threads=1 --minloglevel=2)
spm_train --input=kjv.txt --model_prefix=llama2 --model_type=bpe --vocab_size=1000 --byte_fallback=true \
  --split_digits=true --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --character_coverage=0.9999 "${SPM[@]}" >spm.log 2>&1 &&
  spm_train --input=kjv_part.txt --model_prefix=t5 --model_type=unigram --vocab_size=800 --pad_id=0 --eos_id=1 \
    --unk_id=2 --bos_id=-1 "${SPM[@]}" >>spm.log 2>&1 ||
  { fail "spm_train failed: $(tail -n 3 spm.log)"; e2e_finish; }
ref() { "$PY" "$SRC/tests/e2e/sentencepiece_reference.py" "$@"; }

# 1. Vectors: the shared tokenizer vectors and the special-token ones, for each type and model.
cat "$SRC/tests/fixtures/tokenizer_vectors.jsonl" "$SRC/tests/fixtures/sentencepiece_vectors.jsonl" >vectors.jsonl
for v in "Llama2Tokenizer llama2.model 0" "GPTSentencePieceTokenizer llama2.model 0" \
         "SentencePieceTokenizer llama2.model 0" "SentencePieceTokenizer t5.model 3" "GPTSentencePieceTokenizer t5.model 0"; do
  read -r type model extra <<<"$v"
  name="$type ($model, --vocab-extra-ids $extra)"
  if ref "$type" "$model" "$extra" vectors vectors.jsonl >vec.ref 2>vec.err &&
     "$LATTICE" tokenize --jsonl --tokenizer-type "$type" --tokenizer-model "$model" --vocab-extra-ids "$extra" \
       <vectors.jsonl >vec.out 2>>vec.err; then
    cmp -s vec.ref vec.out && pass "$name: $(line_count vectors.jsonl) vectors, same ids as Megatron's" ||
      { fail "$name: vectors differ from Megatron's (line: vector):"; diff vec.ref vec.out | head -n 10 >&2; }
    # Decoding: Megatron's detokenize of the same ids (special tokens as " TOKEN "), as JSON strings.
    n=0 && rm -f dec.*.out
    while IFS= read -r ids; do
      n=$((n + 1))
      printf '%s' "$ids" | "$LATTICE" tokenize --decode --tokenizer-type "$type" --tokenizer-model "$model" \
        --vocab-extra-ids "$extra" >dec.$n.out 2>>vec.err || break
    done <vec.ref
    ref "$type" "$model" "$extra" decode vec.ref >dec.ref &&
      "$PY" -c 'import json, sys; [print(json.dumps(open("dec.%d.out" % i, encoding="utf-8", newline="").read())) for i in range(1, int(sys.argv[1]) + 1)]' \
        "$n" >dec.out && cmp -s dec.ref dec.out && pass "$name: $n decodings, same text as Megatron's" ||
      { fail "$name: decodings differ from Megatron's (line: vector):"; diff dec.ref dec.out | head -n 6 >&2; }
  else
    fail "$name: vectors: reference or lattice failed: $(head -n 3 vec.err)"
  fi
done
L2=(--tokenizer-type Llama2Tokenizer --tokenizer-model llama2.model)
got=$(printf 'In the beginning' | "$LATTICE" tokenize "${L2[@]}")
[ "${got%% *}" = 1 ] && pass "Llama2Tokenizer starts with <s>: $got" || fail "Llama2Tokenizer: got '$got', want 1 first"

# 2. The whole King James Bible as one text; decode inverts encode.
ref Llama2Tokenizer llama2.model 0 text kjv.txt >kjv.ref || fail "the reference on the KJV text failed"
"$LATTICE" tokenize "${L2[@]}" <kjv.txt >kjv.ids || fail "lattice tokenize on the KJV text failed"
cmp -s kjv.ref kjv.ids && pass "whole KJV text ($(wc -w <kjv.ids) tokens): same ids as Megatron's Llama2Tokenizer" ||
  fail "KJV ids differ from Megatron's: $(cmp kjv.ref kjv.ids 2>&1 | head -n 1)"
"$LATTICE" tokenize --decode "${L2[@]}" <kjv.ids >kjv.back
cmp -s kjv.txt kjv.back && pass "decode(encode(KJV)) == KJV" || fail "decode(encode(KJV)) is not the KJV"

# 3. preprocess: Megatron's files (uint16 ids), 1 and 2 workers, Llama2Tokenizer and SentencePieceTokenizer.
"$SRC/scripts/kjv-to-jsonl.sh" kjv.jsonl >/dev/null
for v in "Llama2Tokenizer llama2.model 0" "SentencePieceTokenizer t5.model 2"; do
  read -r type model extra <<<"$v"
  for w in 1 2; do
    "$LATTICE" preprocess --input kjv.jsonl --json-keys text --tokenizer-type "$type" --tokenizer-model "$model" \
      --vocab-extra-ids "$extra" --output-prefix "$type$w" --append-eod --workers $w --no-progress 2>pre.log ||
      fail "$type: preprocess --workers $w failed: $(cat pre.log)"
  done
  out=$(ref "$type" "$model" "$extra" dataset kjv.jsonl "${type}2_text_document" 2>&1) &&
    pass "$type: preprocess KJV --workers 2: $out" || fail "$type: preprocess KJV --workers 2: $out"
  cmp -s "${type}1_text_document.bin" "${type}2_text_document.bin" &&
    cmp -s "${type}1_text_document.idx" "${type}2_text_document.idx" &&
    pass "$type: preprocess --workers 1 and 2 give the same bytes" || fail "$type: preprocess --workers 1 and 2 differ"
done

# 4. Train with Llama2Tokenizer, generate from text, export to HF with tokenizer.model and back.
if "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
     --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-3 --log-interval 1 --eval-iters 0 \
     --data-path Llama2Tokenizer1_text_document --split 100,0,0 "${L2[@]}" --save ckpt >train.out 2>&1; then
  pass "train --tokenizer-type Llama2Tokenizer on the preprocessed KJV"
else
  fail "train with Llama2Tokenizer failed:"; tail -n 5 train.out >&2
fi
# --use-checkpoint-args takes the tokenizer flags, --tokenizer-model included; with
# --no-use-tokenizer-model-from-checkpoint-args the command line gives it (Megatron's).
RES=(train --use-checkpoint-args --load ckpt --micro-batch-size 2 --global-batch-size 2 --train-iters 3 --lr 1e-3 --override-opt_param-scheduler
     --eval-iters 0 --data-path Llama2Tokenizer1_text_document --split 100,0,0)
"$LATTICE" "${RES[@]}" >res.out 2>&1 && grep -q "iteration        3/" res.out &&
  pass "--use-checkpoint-args resumes with the checkpoint's --tokenizer-model" ||
  fail "--use-checkpoint-args with the checkpoint's tokenizer: $(tail -n 2 res.out)"
expect_error "--no-use-tokenizer-model-from-checkpoint-args without --tokenizer-model" "--tokenizer-model" -- \
  "$LATTICE" "${RES[@]}" --no-use-tokenizer-model-from-checkpoint-args
"$LATTICE" "${RES[@]}" --no-use-tokenizer-model-from-checkpoint-args --tokenizer-model llama2.model >res2.out 2>&1 &&
  grep -q "iteration        3/" res2.out && pass "--no-use-tokenizer-model-from-checkpoint-args with --tokenizer-model" ||
  fail "--no-use-tokenizer-model-from-checkpoint-args --tokenizer-model: $(tail -n 2 res2.out)"
GEN=(--prompt "In the beginning" --max-new-tokens 8 --temperature 0)
if "$LATTICE" generate --load ckpt "${GEN[@]}" >gen_a.out 2>gen_a.err; then
  grep -q '^In the beginning' gen_a.out && [ "$(wc -c <gen_a.out)" -gt 16 ] &&
    pass "generate uses the checkpoint's tokenizer: $(head -c 60 gen_a.out | tr '\n' ' ')" ||
    fail "generate: unexpected output '$(cat gen_a.out)'"
else
  fail "generate from the Llama2Tokenizer checkpoint failed: $(cat gen_a.err)"
fi
if "$LATTICE" convert --load ckpt --to-hf hf >/dev/null 2>&1 && cmp -s llama2.model hf/tokenizer.model; then
  pass "convert --to-hf copies the model as tokenizer.model"
else
  fail "convert --to-hf: tokenizer.model not copied"
fi
if "$LATTICE" convert --from-hf hf --save ckpt2 >/dev/null 2>conv.err && grep -q 'tokenizer Llama2Tokenizer' conv.err &&
   "$LATTICE" generate --load ckpt2 "${GEN[@]}" >gen_b.out 2>/dev/null && cmp -s gen_a.out gen_b.out; then
  pass "convert --from-hf of the export records its tokenizer.model: the same generation"
else
  fail "convert --from-hf of the exported folder: $(cat conv.err)"
fi
# A HuggingFace folder that lattice did not write: tokenizer.model makes it Llama2Tokenizer.
mkdir hf_plain && cp hf/model.safetensors hf/tokenizer.model hf_plain/ &&
  "$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); j.pop("lattice_tokenizer_type", None); json.dump(j, open(sys.argv[2], "w"))' \
    hf/config.json hf_plain/config.json
if "$LATTICE" convert --from-hf hf_plain --save ckpt3 >/dev/null 2>conv3.err && grep -q 'tokenizer Llama2Tokenizer' conv3.err &&
   "$LATTICE" generate --load ckpt3 "${GEN[@]}" >gen_c.out 2>/dev/null && cmp -s gen_a.out gen_c.out; then
  pass "convert --from-hf of a folder with tokenizer.model records Llama2Tokenizer: the same generation"
else
  fail "convert --from-hf of a plain folder with tokenizer.model: $(cat conv3.err)"
fi

# 5. Bad models: one line naming the flag and the file; nothing written.
head -c 3000 llama2.model >cut.model
printf 'not a model\n' >text.model
spm_train --input=kjv_part.txt --model_prefix=noeos --model_type=bpe --vocab_size=300 --eos_id=-1 "${SPM[@]}" >/dev/null 2>&1
expect_error "truncated model" "--tokenizer-model|cut.model|not a SentencePiece model" -- \
  "$LATTICE" preprocess --input kjv.jsonl "${L2[@]:0:2}" --tokenizer-model cut.model --output-prefix failed
expect_error "a text file as the model" "--tokenizer-model|text.model|not a SentencePiece model" -- \
  "$LATTICE" tokenize --tokenizer-type SentencePieceTokenizer --tokenizer-model text.model
expect_error "no eos piece" "noeos.model|no eos piece" -- \
  "$LATTICE" preprocess --input kjv.jsonl --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model noeos.model --output-prefix failed
expect_error "missing model" "--tokenizer-model|missing.model|cannot open" -- \
  "$LATTICE" train --mock-data --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
    --max-position-embeddings 32 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-3 \
    --tokenizer-type Llama2Tokenizer --tokenizer-model missing.model --save failed_ckpt
expect_error "no tokenizer.model in the folder" "--tokenizer-model|tokenizer.model|cannot open" -- \
  "$LATTICE" tokenize --tokenizer-type Llama2Tokenizer --tokenizer-model "$TMP/ckpt"
expect_error "--vocab-extra-ids with Llama2Tokenizer" "--vocab-extra-ids|Llama2Tokenizer" -- \
  "$LATTICE" tokenize "${L2[@]}" --vocab-extra-ids 4
expect_error "--vocab-file with SentencePieceTokenizer" "--vocab-file|does not apply" -- \
  "$LATTICE" tokenize --tokenizer-type SentencePieceTokenizer --tokenizer-model t5.model --vocab-file x.json
# A Llama 2-style folder given as HuggingFaceTokenizer: the error points to Llama2Tokenizer.
mkdir -p l2only l2both && cp llama2.model l2only/tokenizer.model && cp llama2.model l2both/tokenizer.model
printf '{"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []}}' >l2both/tokenizer.json
expect_error "HuggingFaceTokenizer on a folder with tokenizer.model only" "l2only|no tokenizer.json|Llama2Tokenizer" -- \
  "$LATTICE" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model l2only
expect_error "HuggingFaceTokenizer on Llama 2's byte-fallback tokenizer.json" "l2both/tokenizer.json|byte_fallback|Llama2Tokenizer" -- \
  "$LATTICE" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model l2both
ls -d failed* >/dev/null 2>&1 && fail "a failed run left files: $(ls -d failed*)" || pass "failed runs left no files"

e2e_finish
