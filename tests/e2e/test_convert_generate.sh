#!/usr/bin/env bash
# lattice convert and generate as a user runs them: a trained checkpoint to HuggingFace GPT-2 and
# back (same generations, byte-identical HF files on a second trip), the independent HF fixture in,
# generation with the KV cache against a full forward per token (same text, also across context
# shifts), determinism for a seed, --prompt-file, and bad input (one-line errors, nothing overwritten).
#   bash tests/e2e/test_convert_generate.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

# same NAME A B: the two files are byte-identical.
same() {
  if cmp -s "$2" "$3"; then pass "$1"; else fail "$1: $2 and $3 differ"; fi
}

# A tiny ByteTokenizer model (context 16, so 40 new tokens cross several context shifts).
run train "$LATTICE" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --train-iters 3 \
  --lr 1e-2 --min-lr 1e-2 --log-interval 1 --seed 7 --mock-data --tokenizer-type ByteTokenizer --save ckpt || e2e_finish

# ---- lattice -> HF -> lattice -> HF ----
if run to_hf "$LATTICE" convert --load ckpt --to-hf hf; then
  [ -s hf/model.safetensors ] && [ -s hf/config.json ] || fail "convert --to-hf wrote no model.safetensors/config.json"
  for pat in '"model_type": "gpt2"' '"n_layer": 2' '"n_embd": 32' '"n_head": 4' '"n_positions": 16' \
             '"vocab_size": 257' '"activation_function": "gelu"' '"lattice_tokenizer_type": "ByteTokenizer"'; do
    grep -qF -- "$pat" hf/config.json || fail "hf/config.json lacks $pat"
  done
  grep -qF 'transformer.h.1.attn.c_attn.weight' hf/model.safetensors || fail "hf/model.safetensors lacks HF names"
fi
run from_hf "$LATTICE" convert --from-hf hf --save ckpt2 &&
  run to_hf2 "$LATTICE" convert --load ckpt2 --to-hf hf2 &&
  same "HF -> lattice -> HF gives byte-identical model.safetensors" hf/model.safetensors hf2/model.safetensors &&
  same "HF -> lattice -> HF gives the same config.json" hf/config.json hf2/config.json

# ---- --hf-dtype bfloat16 --max-shard-size: transformers' shards and index, read back ----
if run to_hf_bf16 "$LATTICE" convert --load ckpt --to-hf hfbf --hf-dtype bfloat16 --max-shard-size 10KB; then
  shards=$(ls hfbf/model-*-of-*.safetensors 2>/dev/null | wc -l)
  if [ "$shards" -gt 1 ] && [ ! -e hfbf/model.safetensors ] && grep -qF '"torch_dtype": "bfloat16"' hfbf/config.json &&
     /usr/bin/python3 -c '
import json, os, struct, sys
index = json.load(open("hfbf/model.safetensors.index.json"))
total = 0
for f in sorted(set(index["weight_map"].values())):
    raw = open(os.path.join("hfbf", f), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, t in header.items():
        if name == "__metadata__": continue
        assert t["dtype"] == "BF16", (name, t["dtype"])
        assert index["weight_map"][name] == f, name
        total += t["data_offsets"][1] - t["data_offsets"][0]
assert index["metadata"]["total_size"] == total, (index["metadata"], total)
' 2>to_hf_bf16.py.err; then
    pass "--hf-dtype bfloat16 --max-shard-size 10KB: $shards BF16 shards and a consistent index"
  else
    fail "--hf-dtype bfloat16 --max-shard-size 10KB: $shards shards, $(cat to_hf_bf16.py.err)"
  fi
  # In again (sharded, bf16) and out in float32: every value is the bf16 one, exactly.
  if run from_bf16 "$LATTICE" convert --from-hf hfbf --save ckptbf &&
     run to_hf32 "$LATTICE" convert --load ckptbf --to-hf hf32 &&
     run gen_bf "$LATTICE" generate --load ckptbf --prompt "In the beginning" --max-new-tokens 8; then
    if /usr/bin/python3 -c '
import array, json, struct
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__": continue
        a = array.array("I")
        a.frombytes(raw[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
        out[name] = a
    return out
f32, back = tensors("hf/model.safetensors"), tensors("hf32/model.safetensors")
assert f32.keys() == back.keys()
for name, a in f32.items():
    for u, v in zip(a, back[name]):
        assert (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16) == v, name
' 2>bf_values.err; then
      pass "a sharded bfloat16 export reads back as the float32 export rounded to nearest even, and generates"
    else
      fail "bfloat16 values read back differ from the float32 export rounded: $(tail -n 2 bf_values.err)"
    fi
  fi
fi
expect_error "convert: --hf-dtype int8" "--hf-dtype" -- "$LATTICE" convert --load ckpt --to-hf hfx --hf-dtype int8
expect_error "convert: --max-shard-size 5XB" "--max-shard-size" -- "$LATTICE" convert --load ckpt --to-hf hfx --max-shard-size 5XB
expect_error "convert: --hf-dtype with --from-hf" "--to-hf only" -- "$LATTICE" convert --from-hf hf --save y --hf-dtype bf16
[ -e hfx ] && fail "a refused --to-hf created hfx"

GEN=(--prompt "In the beginning" --max-new-tokens 40 --temperature 0.9 --top-k 50 --seed 5)
run gen_a "$LATTICE" generate --load ckpt "${GEN[@]}" &&
  run gen_b "$LATTICE" generate --load ckpt2 "${GEN[@]}" &&
  same "generations from the checkpoint and its HF round trip are identical" gen_a.out gen_b.out

# ---- generate: determinism, KV cache vs full forward, prompt file ----
if run gen_a2 "$LATTICE" generate --load ckpt "${GEN[@]}"; then
  same "generate is deterministic for a fixed --seed" gen_a.out gen_a2.out
  [ "$(head -c 16 gen_a.out)" = "In the beginning" ] || fail "output does not start with the prompt"
  [ "$(wc -c <gen_a.out)" -gt 17 ] || fail "generate produced no tokens"
  grep -q 'prefill 16 tokens.*new tokens.*tokens/s, KV cache' gen_a.err || fail "no timing line: $(cat gen_a.err)"
fi
run gen_seed "$LATTICE" generate --load ckpt --prompt "In the beginning" --max-new-tokens 40 \
  --temperature 0.9 --top-k 50 --seed 6 &&
  { cmp -s gen_a.out gen_seed.out && fail "--seed 5 and --seed 6 give the same text" || pass "another --seed gives other text"; }
for args in "--temperature 0" "--temperature 1.0 --seed 9" "--temperature 0.7 --top-p 0.9 --seed 2"; do
  # shellcheck disable=SC2086
  run kv "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 40 $args &&
    run full "$LATTICE" generate --load ckpt --prompt "ab" --max-new-tokens 40 $args --no-kv-cache &&
    same "KV cache and full forward give the same 40 tokens ($args, context 16)" kv.out full.out
done
grep -q 'full forward per token' full.err || fail "--no-kv-cache timing line: $(cat full.err)"

printf 'In the beginning\n\nAnd God said\n' > prompts.txt
if run pf "$LATTICE" generate --load ckpt --prompt-file prompts.txt --max-new-tokens 40 --temperature 0.9 \
     --top-k 50 --seed 5; then
  # The first prompt draws from the same stream as a single --prompt run with that seed.
  [ "$(head -c "$(wc -c <gen_a.out)" pf.out)" = "$(cat gen_a.out)" ] &&
    pass "--prompt-file: first prompt's text equals the --prompt run" ||
    fail "--prompt-file: first prompt's text differs from the --prompt run"
  grep -qF 'And God said' pf.out && pass "--prompt-file: second prompt generated" || fail "--prompt-file: no second prompt"
  grep -q '^generate: 2 prompt(s)' pf.err || fail "--prompt-file: expected 2 prompts: $(cat pf.err)"
fi
# --batch-size: five prompts of other lengths decoded three at a time (a finished prompt's place taken by
# the next; contexts of 16 filling and moving) print what they print one at a time, in prompt order.
printf 'In the beginning\nab\nAnd God said unto Moses, saying\n\nx\nLet there be light\n' > prompts5.txt
for args in "--temperature 0" "--temperature 0.9 --top-k 50 --seed 5"; do
  # shellcheck disable=SC2086
  run one_at_a_time "$LATTICE" generate --load ckpt --prompt-file prompts5.txt --max-new-tokens 40 $args &&
    run batched "$LATTICE" generate --load ckpt --prompt-file prompts5.txt --max-new-tokens 40 $args --batch-size 3 &&
    same "--batch-size 3 prints what one prompt at a time prints ($args)" one_at_a_time.out batched.out
done
grep -q '^generate: 5 prompt(s), .*KV cache, batch 3)' batched.err || fail "--batch-size: timing line: $(cat batched.err)"
run batched_bf16 "$LATTICE" generate --load ckpt --prompt-file prompts5.txt --max-new-tokens 12 --batch-size 8 --bf16 &&
  { [ "$(head -c 16 batched_bf16.out)" = "In the beginning" ] && grep -qaF 'Let there be light' batched_bf16.out &&
      pass "--batch-size 8 --bf16: the prompts' texts" || fail "--batch-size 8 --bf16: $(cat batched_bf16.out)"; }
expect_error "generate: --batch-size without the KV cache" "--batch-size 2 decodes with the KV cache" -- \
  "$LATTICE" generate --load ckpt --prompt a --batch-size 2 --no-kv-cache
expect_error "generate: --batch-size 0" "--batch-size must be an integer >= 1" -- \
  "$LATTICE" generate --load ckpt --prompt a --batch-size 0
expect_error "generate: --repetition-penalty 0" "--repetition-penalty must be a number > 0" -- \
  "$LATTICE" generate --load ckpt --prompt a --repetition-penalty 0
expect_error "generate: --presence-penalty 3" "--presence-penalty must be in [-2, 2]" -- \
  "$LATTICE" generate --load ckpt --prompt a --presence-penalty 3
# A presence penalty steers the sampled text away from tokens it has written, alike with and without the
# KV cache and through --batch-size.
if run pen_a "$LATTICE" generate --load ckpt --prompt "In the" --max-new-tokens 24 --temperature 0.9 --top-k 50 --seed 5 --presence-penalty 2 &&
   run pen_b "$LATTICE" generate --load ckpt --prompt "In the" --max-new-tokens 24 --temperature 0.9 --top-k 50 --seed 5 --presence-penalty 2 \
     --no-kv-cache &&
   run pen_c "$LATTICE" generate --load ckpt --prompt "In the" --prompt-file /dev/null --max-new-tokens 24 \
     --temperature 0.9 --top-k 50 --seed 5 --presence-penalty 2 --batch-size 2 &&
   run pen_0 "$LATTICE" generate --load ckpt --prompt "In the" --max-new-tokens 24 --temperature 0.9 --top-k 50 --seed 5; then
  cmp -s pen_a.out pen_b.out && cmp -s pen_a.out pen_c.out && ! cmp -s pen_a.out pen_0.out &&
    pass "--presence-penalty: the same text with and without the KV cache and batched, not the plain one's" ||
    fail "--presence-penalty: $(head -c 80 pen_a.out) / $(head -c 80 pen_b.out) / $(head -c 80 pen_c.out) / $(head -c 80 pen_0.out)"
fi
run zero "$LATTICE" generate --load ckpt --prompt "xyz" --max-new-tokens 0 &&
  { [ "$(cat zero.out)" = "xyz" ] && pass "--max-new-tokens 0 prints the prompt" || fail "--max-new-tokens 0: $(cat zero.out)"; }

# ---- the independent HF fixture in ----
FX="$SRC/tests/fixtures/hf_gpt2_tiny"
if run fx "$LATTICE" convert --from-hf "$FX" --save fxckpt; then
  grep -q 'vocab 101 padded to 128' fx.err || fail "fixture import: $(cat fx.err)"
  # Back out: same config (the unit tests compare every tensor; the buffers are not kept).
  if run fx_back "$LATTICE" convert --load fxckpt --to-hf fxhf; then
    for key in n_layer n_embd n_head n_positions vocab_size activation_function; do
      [ "$(grep "\"$key\"" "$FX/config.json")" = "$(grep "\"$key\"" fxhf/config.json)" ] ||
        fail "fixture round trip changed config.json $key"
    done
  fi
  expect_error "generate: converted model without a tokenizer" "names no tokenizer|--tokenizer-type" -- \
    "$LATTICE" generate --load fxckpt --prompt hi
  expect_error "generate: tokenizer larger than the model" "ByteTokenizer|257|101" -- \
    "$LATTICE" generate --load fxckpt --prompt hi --tokenizer-type ByteTokenizer
fi
expect_error "convert: --tokenizer-type larger than the vocabulary" "ByteTokenizer|vocab_size 101" -- \
  "$LATTICE" convert --from-hf "$FX" --save fx_tok --tokenizer-type ByteTokenizer
[ -e fx_tok ] && fail "a failed convert created --save fx_tok"

# ---- bad input ----
expect_error "convert: no direction" "--from-hf|--to-hf" -- "$LATTICE" convert --save x
expect_error "convert: both directions" "--from-hf|--to-hf" -- "$LATTICE" convert --from-hf hf --to-hf y --load ckpt
expect_error "convert: missing --from-hf dir" "nothere|config.json" -- "$LATTICE" convert --from-hf nothere --save y
[ -e y ] && fail "a failed convert created --save y"
mkdir -p badhf && cp hf/model.safetensors badhf/ && echo '{"n_layer": 2, "n_embd": 32' > badhf/config.json
expect_error "convert: corrupt config.json" "config.json|invalid JSON" -- "$LATTICE" convert --from-hf badhf --save y
md5_before=$(md5sum hf/model.safetensors hf/config.json)
expect_error "convert: --to-hf over an existing model" "already holds a model" -- \
  "$LATTICE" convert --load ckpt2 --to-hf hf
[ "$(md5sum hf/model.safetensors hf/config.json)" = "$md5_before" ] || fail "a refused --to-hf changed hf/"
md5_before=$(md5sum ckpt/latest_checkpointed_iteration.txt)
expect_error "convert: --save over an existing checkpoint" "already holds a checkpoint" -- \
  "$LATTICE" convert --from-hf hf --save ckpt
[ "$(md5sum ckpt/latest_checkpointed_iteration.txt)" = "$md5_before" ] || fail "a refused --save changed ckpt/"
expect_error "generate: missing --prompt-file" "--prompt-file|nope.txt" -- \
  "$LATTICE" generate --load ckpt --prompt-file nope.txt
expect_error "generate: no prompt" "--prompt" -- "$LATTICE" generate --load ckpt
expect_error "generate: negative --max-new-tokens" "--max-new-tokens" -- \
  "$LATTICE" generate --load ckpt --prompt a --max-new-tokens -1
expect_error "generate: --top-p 0" "--top-p" -- "$LATTICE" generate --load ckpt --prompt a --top-p 0
expect_error "generate: fractional --top-k" "--top-k" -- "$LATTICE" generate --load ckpt --prompt a --top-k 1.5

# ---- the rotary embedding: no HF GPT-2 form; resuming needs the same position embedding ----
ROPE=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 2 --lr 1e-2 --log-interval 1 --seed 7 --mock-data
      --tokenizer-type ByteTokenizer --position-embedding-type rope --rotary-percent 0.5)
if run rope_train "$LATTICE" "${ROPE[@]}" --train-iters 3 --exit-interval 2 --save ckpt-rope; then
  grep -qF 'embedding.position_embeddings' ckpt-rope/iter_0000002/*.json &&
    fail "a rope checkpoint lists position_embeddings"
  expect_error "convert: rope model to HF GPT-2" "--to-hf|rotary|learned absolute positions" -- \
    "$LATTICE" convert --load ckpt-rope --to-hf hf-rope
  [ -e hf-rope ] && fail "convert --to-hf of a rope model left hf-rope behind"
  expect_error "resume: rope checkpoint, learned positions" "position_embedding_type|--position-embedding-type" -- \
    "$LATTICE" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
    --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --lr 1e-2 --seed 7 --mock-data \
    --tokenizer-type ByteTokenizer --train-iters 3 --load ckpt-rope
  expect_error "resume: another --rotary-percent" "rotary_percent|--rotary-percent" -- \
    "$LATTICE" "${ROPE[@]/0.5/1.0}" --train-iters 3 --load ckpt-rope
  if run rope_resume "$LATTICE" "${ROPE[@]}" --train-iters 3 --load ckpt-rope --save ckpt-rope &&
     run rope_gen "$LATTICE" generate --load ckpt-rope --prompt "ab" --max-new-tokens 40 --seed 3 &&
     run rope_gen_full "$LATTICE" generate --load ckpt-rope --prompt "ab" --max-new-tokens 40 --seed 3 --no-kv-cache; then
    same "rope: generate with the KV cache prints what full recomputation prints" rope_gen.out rope_gen_full.out
  fi
fi
# ---- --kv-channels other than hidden / heads, with RMSNorm: trains, generates, has no GPT-2 form ----
if run kv_train "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --kv-channels 16 --normalization RMSNorm --train-iters 2 \
     --save ckpt-kv; then
  expect_error "resume: RMSNorm checkpoint, LayerNorm run" "normalization|--normalization" -- \
    "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --kv-channels 16 --train-iters 3 --load ckpt-kv
  expect_error "convert: --kv-channels 16 x 4 heads to HF GPT-2" "--to-hf|--kv-channels 16|hidden size 32" -- \
    "$LATTICE" convert --load ckpt-kv --to-hf hf-kv
  [ -e hf-kv ] && fail "convert --to-hf of a --kv-channels model left hf-kv behind"
  run kv_gen "$LATTICE" generate --load ckpt-kv --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run kv_gen_full "$LATTICE" generate --load ckpt-kv --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--kv-channels 16, RMSNorm: generate with the KV cache prints what full recomputation prints" kv_gen.out kv_gen_full.out
fi
# ---- --disable-bias-linear: trains, resumes only so, generates, has no GPT-2 form ----
NOBIAS=("${ROPE[@]/rope/learned_absolute}" --disable-bias-linear)
if run nobias_train "$LATTICE" "${NOBIAS[@]}" --train-iters 3 --exit-interval 2 --save ckpt-nobias; then
  grep -qF 'linear_qkv.bias' ckpt-nobias/iter_0000002/*.json && fail "a --disable-bias-linear checkpoint lists linear_qkv.bias"
  expect_error "convert: no linear biases to HF GPT-2" "--to-hf|--disable-bias-linear" -- \
    "$LATTICE" convert --load ckpt-nobias --to-hf hf-nobias
  expect_error "resume: no-bias checkpoint, with biases" "add_bias_linear|--disable-bias-linear" -- \
    "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --train-iters 3 --load ckpt-nobias
  run nobias_resume "$LATTICE" "${NOBIAS[@]}" --train-iters 3 --load ckpt-nobias --save ckpt-nobias &&
    run nobias_gen "$LATTICE" generate --load ckpt-nobias --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run nobias_gen_full "$LATTICE" generate --load ckpt-nobias --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--disable-bias-linear: generate with the KV cache prints what full recomputation prints" nobias_gen.out nobias_gen_full.out
fi
expect_error "--normalization ScaleNorm" "--normalization|ScaleNorm" -- "$LATTICE" "${ROPE[@]}" --normalization ScaleNorm \
  --train-iters 1
if run rms_train "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --normalization RMSNorm --train-iters 1 --save ckpt-rms; then
  grep -qF 'input_layernorm.bias' ckpt-rms/iter_0000001/*.json && fail "an RMSNorm checkpoint lists input_layernorm.bias"
  expect_error "convert: RMSNorm to HF GPT-2" "--to-hf|RMSNorm" -- "$LATTICE" convert --load ckpt-rms --to-hf hf-rms
fi
# ---- --squared-relu: recorded in the checkpoint, resumes only so, HF GPT-2 with relu2 and back ----
GELU=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 2 --lr 1e-2 --log-interval 1 --seed 7 --mock-data
      --tokenizer-type ByteTokenizer)
RELU2=("${GELU[@]}" --squared-relu)
expect_error "--squared-relu with --swiglu" "--squared-relu and --swiglu" -- "$LATTICE" "${RELU2[@]}" --swiglu \
  --train-iters 1
if run relu2_train "$LATTICE" "${RELU2[@]}" --train-iters 3 --exit-interval 2 --save ckpt-relu2; then
  grep -q '"squared_relu": *true' ckpt-relu2/iter_0000002/*.json || fail "the checkpoint does not record squared_relu"
  expect_error "resume: squared-ReLU checkpoint, GELU run" "squared_relu|--squared-relu" -- \
    "$LATTICE" "${GELU[@]}" --train-iters 3 --load ckpt-relu2
  run relu2_resume "$LATTICE" "${RELU2[@]}" --train-iters 3 --load ckpt-relu2 ||
    fail "the squared-ReLU checkpoint did not resume with --squared-relu"
  if run relu2_to_hf "$LATTICE" convert --load ckpt-relu2 --to-hf hf-relu2; then
    grep -qF '"activation_function": "relu2"' hf-relu2/config.json || fail "hf-relu2/config.json is not relu2"
    run relu2_from_hf "$LATTICE" convert --from-hf hf-relu2 --save ckpt-relu2b &&
      run relu2_gen_a "$LATTICE" generate --load ckpt-relu2 "${GEN[@]}" &&
      run relu2_gen_b "$LATTICE" generate --load ckpt-relu2b "${GEN[@]}" &&
      same "--squared-relu: generations from the checkpoint and its HF relu2 round trip are identical" \
        relu2_gen_a.out relu2_gen_b.out
  fi
fi
# ---- --apply-layernorm-1p (every norm scales by 1 + weight; with the query and key norms): recorded,
# resumes only so, generates the same with the KV cache (its own 1 + weight) as by full
# recomputation, has no HF form ----
LN1P=("${ROPE[@]}" --qk-layernorm --apply-layernorm-1p)
if run ln1p_train "$LATTICE" "${LN1P[@]}" --train-iters 3 --exit-interval 2 --save ckpt-ln1p; then
  grep -q '"apply_layernorm_1p": *true' ckpt-ln1p/iter_0000002/*.json || fail "the checkpoint does not record apply_layernorm_1p"
  expect_error "resume: 1p checkpoint, plain norms" "apply_layernorm_1p|--apply-layernorm-1p" -- \
    "$LATTICE" "${ROPE[@]}" --qk-layernorm --train-iters 3 --load ckpt-ln1p
  run ln1p_gen "$LATTICE" generate --load ckpt-ln1p --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run ln1p_gen_full "$LATTICE" generate --load ckpt-ln1p --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--apply-layernorm-1p: generate with the KV cache prints what full recomputation prints" ln1p_gen.out ln1p_gen_full.out
fi
if run ln1p_gpt2_train "$LATTICE" "${GELU[@]}" --apply-layernorm-1p --train-iters 1 --save ckpt-ln1p-gpt2; then
  expect_error "convert: 1p norms to HF" "--to-hf|--apply-layernorm-1p" -- \
    "$LATTICE" convert --load ckpt-ln1p-gpt2 --to-hf hf-ln1p
  [ -e hf-ln1p ] && fail "convert --to-hf of a 1p model left hf-ln1p behind"
fi
# ---- --swiglu (with rope, RMSNorm, no linear biases, untied, 2 query groups of 2 heads: a Llama-style
# model): trains, resumes only so, generates, has no GPT-2 form ----
GELU_LLAMA=("${ROPE[@]/0.5/1}" --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights
            --ffn-hidden-size 96 --group-query-attention --num-query-groups 2)
LLAMA=("${GELU_LLAMA[@]}" --swiglu)
expect_error "--swiglu with --openai-gelu" "--openai-gelu and --swiglu" -- "$LATTICE" "${LLAMA[@]}" --openai-gelu \
  --train-iters 1
if run llama_train "$LATTICE" "${LLAMA[@]}" --train-iters 3 --exit-interval 2 --save ckpt-llama; then
  grep -q '"swiglu": *true' ckpt-llama/iter_0000002/*.json || fail "the SwiGLU checkpoint does not record swiglu"
  expect_error "resume: SwiGLU checkpoint, GELU run" "swiglu|--swiglu" -- \
    "$LATTICE" "${GELU_LLAMA[@]}" --train-iters 3 --load ckpt-llama
  expect_error "resume: 2 query groups, now one per head" "num_query_groups is 2|--num-query-groups" -- \
    "$LATTICE" "${ROPE[@]/0.5/1}" --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights \
    --ffn-hidden-size 96 --swiglu --train-iters 3 --load ckpt-llama
  # It has a HuggingFace Llama form: out and back, the same model generates the same text.
  if run llama_to_hf "$LATTICE" convert --load ckpt-llama --to-hf hf-llama; then
    grep -q '"model_type": "llama"' hf-llama/config.json || fail "convert --to-hf of a Llama-style model wrote no Llama config"
    grep -q '"num_key_value_heads": 2' hf-llama/config.json || fail "hf-llama/config.json lost the query groups"
    run llama_from_hf "$LATTICE" convert --from-hf hf-llama --save ckpt-llama-back &&
      run llama_gen_back "$LATTICE" generate --load ckpt-llama-back --prompt "ab" --max-new-tokens 30 --seed 3 &&
      run llama_gen_orig "$LATTICE" generate --load ckpt-llama --prompt "ab" --max-new-tokens 30 --seed 3 &&
      same "Llama: generated text after lattice -> HF Llama -> lattice equals the original's" llama_gen_back.out \
        llama_gen_orig.out
  fi
  if run llama_resume "$LATTICE" "${LLAMA[@]}" --train-iters 3 --load ckpt-llama --save ckpt-llama &&
     run llama_gen "$LATTICE" generate --load ckpt-llama --prompt "ab" --max-new-tokens 30 --seed 3 &&
     run llama_gen_full "$LATTICE" generate --load ckpt-llama --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache; then
    same "SwiGLU: generate with the KV cache prints what full recomputation prints" llama_gen.out llama_gen_full.out
  fi
fi
# ---- --window-size (sliding-window attention, a Mistral-style model): recorded, resumes only so,
# generates the same with the KV cache as by full recomputation (past the context's restart), out to
# HF Mistral and back; with --window-attn-skip-freq no Mistral form; bad values refused ----
expect_error "--window-size with a right window" "--window-size '4,2'|causal" -- \
  "$LATTICE" "${LLAMA[@]}" --window-size 4,2 --train-iters 1
expect_error "--window-size not a number" "--window-size 'four'" -- \
  "$LATTICE" "${LLAMA[@]}" --window-size four --train-iters 1
expect_error "--window-attn-skip-freq alone" "--window-attn-skip-freq needs --window-size" -- \
  "$LATTICE" "${LLAMA[@]}" --window-attn-skip-freq 2 --train-iters 1
expect_error "--window-attn-skip-freq of 3 layers for 2" "has 3 entries for --num-layers 2" -- \
  "$LATTICE" "${LLAMA[@]}" --window-size 3 --window-attn-skip-freq "[1,0,1]" --train-iters 1
SWA=("${LLAMA[@]}" --window-size 3,0)
if run swa_train "$LATTICE" "${SWA[@]}" --train-iters 3 --exit-interval 2 --save ckpt-swa; then
  grep -q '"window_size": *3' ckpt-swa/iter_0000002/*.json || fail "the checkpoint does not record window_size 3"
  expect_error "resume: windowed checkpoint, full attention" "window_size|--window-size" -- \
    "$LATTICE" "${LLAMA[@]}" --train-iters 3 --load ckpt-swa
  run swa_resume "$LATTICE" "${SWA[@]}" --train-iters 3 --load ckpt-swa || fail "the windowed checkpoint did not resume"
  run swa_gen "$LATTICE" generate --load ckpt-swa --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run swa_gen_full "$LATTICE" generate --load ckpt-swa --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--window-size: generate with the KV cache prints what full recomputation prints" swa_gen.out swa_gen_full.out
  if run swa_to_hf "$LATTICE" convert --load ckpt-swa --to-hf hf-swa; then
    grep -q '"model_type": "mistral"' hf-swa/config.json || fail "convert --to-hf of a windowed model wrote no Mistral config"
    grep -q '"sliding_window": 4' hf-swa/config.json || fail "hf-swa/config.json: sliding_window is not 4 (window 3 + the query)"
    run swa_from_hf "$LATTICE" convert --from-hf hf-swa --save ckpt-swa-back &&
      run swa_gen_back "$LATTICE" generate --load ckpt-swa-back --prompt "ab" --max-new-tokens 30 --seed 3 &&
      same "--window-size: generated text after lattice -> HF Mistral -> lattice equals the original's" swa_gen_back.out \
        swa_gen.out
  fi
fi
SWA_SKIP=("${LLAMA[@]}" --window-size 2 --window-attn-skip-freq 2)
if run swa_skip_train "$LATTICE" "${SWA_SKIP[@]}" --train-iters 2 --save ckpt-swa-skip; then
  squeezed_has ckpt-swa-skip/iter_0000002/*.json -- '"window_attn_skip_freq":[1,0]' ||
    fail "the checkpoint does not record the window on layer 1 only"
  run swa_skip_gen "$LATTICE" generate --load ckpt-swa-skip --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run swa_skip_gen_full "$LATTICE" generate --load ckpt-swa-skip --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--window-attn-skip-freq: generate with the KV cache prints what full recomputation prints" swa_skip_gen.out \
      swa_skip_gen_full.out
  expect_error "convert: a window on every other layer to HF Mistral" "--to-hf|--window-attn-skip-freq" -- \
    "$LATTICE" convert --load ckpt-swa-skip --to-hf hf-swa-skip
  [ -e hf-swa-skip ] && fail "convert --to-hf of a skip-frequency model left hf-swa-skip behind"
fi
# ---- --softmax-type (attention sinks): learnable ones are parameters in the checkpoint, resume only
# with the flag, generate the same with the KV cache as by full recomputation (with a window too),
# have no HF form; off-by-one likewise; another value refused ----
expect_error "--softmax-type softmax1" "--softmax-type must be vanilla, off-by-one or learnable" -- \
  "$LATTICE" "${LLAMA[@]}" --softmax-type softmax1 --train-iters 1
SINKS=("${LLAMA[@]}" --softmax-type learnable --window-size 3 --window-attn-skip-freq 2)
if run sinks_train "$LATTICE" "${SINKS[@]}" --train-iters 3 --exit-interval 2 --save ckpt-sinks; then
  grep -qF 'core_attention.softmax_offset' ckpt-sinks/iter_0000002/*.json ||
    fail "a --softmax-type learnable checkpoint lists no core_attention.softmax_offset"
  expect_error "resume: learnable sinks, vanilla softmax" "softmax_type|--softmax-type" -- \
    "$LATTICE" "${LLAMA[@]}" --window-size 3 --window-attn-skip-freq 2 --train-iters 3 --load ckpt-sinks
  run sinks_gen "$LATTICE" generate --load ckpt-sinks --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run sinks_gen_full "$LATTICE" generate --load ckpt-sinks --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--softmax-type learnable: generate with the KV cache prints what full recomputation prints" sinks_gen.out \
      sinks_gen_full.out
  expect_error "convert: attention sinks to HF" "--to-hf|--softmax-type learnable" -- \
    "$LATTICE" convert --load ckpt-sinks --to-hf hf-sinks
  [ -e hf-sinks ] && fail "convert --to-hf of a model with sinks left hf-sinks behind"
fi
if run obo_train "$LATTICE" "${LLAMA[@]}" --softmax-type off-by-one --train-iters 2 --save ckpt-obo; then
  grep -qF 'softmax_offset' ckpt-obo/iter_0000002/*.json && fail "an off-by-one checkpoint lists a softmax_offset parameter"
  run obo_gen "$LATTICE" generate --load ckpt-obo --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run obo_gen_full "$LATTICE" generate --load ckpt-obo --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--softmax-type off-by-one: generate with the KV cache prints what full recomputation prints" obo_gen.out \
      obo_gen_full.out
fi
# ---- --add-qkv-bias (a Llama-style model with QKV's bias only, tied: a Qwen2-style model) ----
NO_QKV_BIAS=("${ROPE[@]/0.5/1}" --normalization RMSNorm --disable-bias-linear --ffn-hidden-size 96 --swiglu
             --group-query-attention --num-query-groups 2)
QWEN2=("${NO_QKV_BIAS[@]}" --add-qkv-bias)
if run qwen2_train "$LATTICE" "${QWEN2[@]}" --train-iters 2 --save ckpt-qwen2; then
  grep -qF 'linear_qkv.bias' ckpt-qwen2/iter_0000002/*.json || fail "an --add-qkv-bias checkpoint has no linear_qkv.bias"
  grep -qF 'linear_proj.bias' ckpt-qwen2/iter_0000002/*.json && fail "an --add-qkv-bias checkpoint lists linear_proj.bias"
  expect_error "resume: QKV-bias checkpoint without --add-qkv-bias" "add_qkv_bias|--add-qkv-bias" -- \
    "$LATTICE" "${NO_QKV_BIAS[@]}" --train-iters 3 --load ckpt-qwen2
  # Its HuggingFace form is Qwen2: out and back, the same model generates the same text.
  if run qwen2_to_hf "$LATTICE" convert --load ckpt-qwen2 --to-hf hf-qwen2; then
    grep -q '"model_type": "qwen2"' hf-qwen2/config.json || fail "convert --to-hf of an --add-qkv-bias model wrote no Qwen2 config"
    grep -q 'Qwen2' qwen2_to_hf.err || fail "convert --to-hf did not say it wrote Qwen2"
    run qwen2_from_hf "$LATTICE" convert --from-hf hf-qwen2 --save ckpt-qwen2-back &&
      run qwen2_gen_back "$LATTICE" generate --load ckpt-qwen2-back --prompt "ab" --max-new-tokens 30 --seed 3 &&
      run qwen2_gen_orig "$LATTICE" generate --load ckpt-qwen2 --prompt "ab" --max-new-tokens 30 --seed 3 &&
      run qwen2_gen_full "$LATTICE" generate --load ckpt-qwen2 --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
      same "Qwen2: generated text after lattice -> HF Qwen2 -> lattice equals the original's" qwen2_gen_back.out \
        qwen2_gen_orig.out &&
      same "--add-qkv-bias: generate with the KV cache prints what full recomputation prints" qwen2_gen_orig.out \
        qwen2_gen_full.out
  fi
fi
# ---- --qk-layernorm (a Llama-style model whose query and key heads are normalized: a Qwen3-style model) ----
QWEN3=("${NO_QKV_BIAS[@]}" --qk-layernorm --kv-channels 16)
if run qwen3_train "$LATTICE" "${QWEN3[@]}" --train-iters 2 --save ckpt-qwen3; then
  grep -qF 'self_attention.k_layernorm.weight' ckpt-qwen3/iter_0000002/*.json ||
    fail "a --qk-layernorm checkpoint has no k_layernorm.weight"
  expect_error "resume: --qk-layernorm checkpoint without --qk-layernorm" "qk_layernorm|--qk-layernorm" -- \
    "$LATTICE" "${NO_QKV_BIAS[@]}" --kv-channels 16 --train-iters 3 --load ckpt-qwen3
  # Its HuggingFace form is Qwen3: out and back, the same model generates the same text, with and
  # without the KV cache.
  if run qwen3_to_hf "$LATTICE" convert --load ckpt-qwen3 --to-hf hf-qwen3; then
    grep -q '"model_type": "qwen3"' hf-qwen3/config.json || fail "convert --to-hf of a --qk-layernorm model wrote no Qwen3 config"
    grep -q 'Qwen3' qwen3_to_hf.err || fail "convert --to-hf did not say it wrote Qwen3"
    run qwen3_from_hf "$LATTICE" convert --from-hf hf-qwen3 --save ckpt-qwen3-back &&
      run qwen3_gen_back "$LATTICE" generate --load ckpt-qwen3-back --prompt "ab" --max-new-tokens 30 --seed 3 &&
      run qwen3_gen_orig "$LATTICE" generate --load ckpt-qwen3 --prompt "ab" --max-new-tokens 30 --seed 3 &&
      run qwen3_gen_full "$LATTICE" generate --load ckpt-qwen3 --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
      same "Qwen3: generated text after lattice -> HF Qwen3 -> lattice equals the original's" qwen3_gen_back.out \
        qwen3_gen_orig.out &&
      same "--qk-layernorm: generate with the KV cache prints what full recomputation prints" qwen3_gen_orig.out \
        qwen3_gen_full.out
  fi
fi
# ---- --qk-l2-norm (the query and key heads scaled to unit RMS with no weights: Llama 4's norm) ----
L2=("${NO_QKV_BIAS[@]}" --qk-l2-norm --kv-channels 16)
expect_error "--qk-l2-norm with --qk-layernorm" "--qk-layernorm and --qk-l2-norm are exclusive" -- \
  "$LATTICE" "${L2[@]}" --qk-layernorm --train-iters 1
if run qkl2_train "$LATTICE" "${L2[@]}" --train-iters 2 --save ckpt-qkl2; then
  grep -q '"qk_l2_norm": *true' ckpt-qkl2/iter_0000002/*.json || fail "a --qk-l2-norm checkpoint does not say so"
  if grep -qE 'self_attention\.(q|k)_layernorm' ckpt-qkl2/iter_0000002/*.json; then
    fail "a --qk-l2-norm checkpoint holds query or key norm weights"
  fi
  expect_error "resume: --qk-l2-norm checkpoint without --qk-l2-norm" "qk_l2_norm|--qk-l2-norm" -- \
    "$LATTICE" "${NO_QKV_BIAS[@]}" --kv-channels 16 --train-iters 3 --load ckpt-qkl2
  expect_error "convert --to-hf of a --qk-l2-norm model" "--qk-l2-norm" -- \
    "$LATTICE" convert --load ckpt-qkl2 --to-hf hf-qkl2
  [ ! -e hf-qkl2 ] || fail "a refused convert --to-hf left hf-qkl2 behind"
  run qkl2_gen "$LATTICE" generate --load ckpt-qkl2 --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run qkl2_gen_full "$LATTICE" generate --load ckpt-qkl2 --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--qk-l2-norm: generate with the KV cache prints what full recomputation prints" qkl2_gen.out qkl2_gen_full.out
fi
# A GPT-2-shaped model with --qk-layernorm has no HuggingFace GPT-2 form: refused, nothing written.
if run gpt2_qknorm "$LATTICE" train --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
  --max-position-embeddings 16 --micro-batch-size 2 --train-iters 1 --mock-data --tokenizer-type ByteTokenizer \
  --qk-layernorm --save ckpt-gpt2-qknorm; then
  expect_error "convert --to-hf of a GPT-2 with --qk-layernorm" "--qk-layernorm (HuggingFace GPT-2 normalizes no query or key)" -- \
    "$LATTICE" convert --load ckpt-gpt2-qknorm --to-hf hf-gpt2-qknorm
  [ ! -e hf-gpt2-qknorm ] || fail "a refused convert --to-hf left hf-gpt2-qknorm behind"
fi
# A HuggingFace Qwen3 folder in: the independent fixture (q_norm, k_norm, head_dim 16, tied).
if run qwen3_fixture "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_qwen3_tiny" --save ckpt-hf-qwen3; then
  grep -q 'Qwen3' qwen3_fixture.err || fail "convert did not say it read a Qwen3 model"
  grep -q '"qk_layernorm": *true' ckpt-hf-qwen3/iter_0000000/*.json || fail "the converted Qwen3 lost --qk-layernorm"
fi
# A HuggingFace Mistral folder in (sliding_window null): Llama's model, one key/value head.
if run mistral_fixture "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_mistral_tiny" --save ckpt-hf-mistral; then
  grep -q 'Mistral' mistral_fixture.err || fail "convert did not say it read a Mistral model"
  grep -q '"num_query_groups": *1' ckpt-hf-mistral/iter_0000000/*.json || fail "the converted Mistral lost its query group"
fi
# A HuggingFace Phi-3 folder in (fused qkv_proj and gate_up_proj, half of each head rotated), and out again
# as Phi-3 (the family it was converted from), every tensor's bytes the same.
if run phi3_fixture "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_phi3_tiny" --save ckpt-hf-phi3; then
  grep -q 'Phi-3' phi3_fixture.err || fail "convert did not say it read a Phi-3 model"
  grep -q '"rotary_percent": *0.5' ckpt-hf-phi3/iter_0000000/*.json || fail "the converted Phi-3 lost its partial rotation"
  if run phi3_back "$LATTICE" convert --load ckpt-hf-phi3 --to-hf hf-phi3; then
    grep -q '"model_type": "phi3"' hf-phi3/config.json || fail "Phi-3 came back as $(grep model_type hf-phi3/config.json)"
    python3 - "$SRC/tests/fixtures/hf_phi3_tiny/model.safetensors" hf-phi3/model.safetensors <<'PY' &&
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a == b, sorted(set(a) ^ set(b)) or [k for k in a if a[k] != b[k]]
PY
      pass "convert: HF Phi-3 in and out, every tensor the same bytes" || fail "Phi-3's tensors changed on the round trip"
  fi
fi
# A HuggingFace StarCoder2 folder in and out (LayerNorm, biases, tanh GELU, rope, a window): the same model_type.
if run sc2_fixture "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_starcoder2_tiny" --save ckpt-hf-sc2; then
  grep -q 'StarCoder2' sc2_fixture.err || fail "convert did not say it read a StarCoder2 model"
  run sc2_back "$LATTICE" convert --load ckpt-hf-sc2 --to-hf hf-sc2 && grep -q '"model_type": "starcoder2"' hf-sc2/config.json &&
    pass "convert: HF StarCoder2 in and out" || fail "StarCoder2 came back as $(grep model_type hf-sc2/config.json)"
fi
# A HuggingFace Qwen2 folder in: the independent fixture (q/k/v biases, tied).
if run qwen2_fixture "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_qwen2_tiny" --save ckpt-hf-qwen2; then
  grep -q 'Qwen2' qwen2_fixture.err || fail "convert did not say it read a Qwen2 model"
  grep -q '"add_qkv_bias": *true' ckpt-hf-qwen2/iter_0000000/*.json || fail "the converted Qwen2 lost its QKV bias"
fi
if run gqa_train "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --group-query-attention --train-iters 1 \
     --save ckpt-gqa; then
  expect_error "convert: grouped-query attention, no other Llama setting" \
    "--to-hf|grouped-query attention|--num-query-groups 1|neither HuggingFace GPT-2, Llama, GPT-OSS, GLM-4.5 nor StarCoder2|learned absolute" -- \
    "$LATTICE" convert --load ckpt-gqa --to-hf hf-gqa
  [ -e hf-gqa ] && fail "convert --to-hf of a grouped-query model left hf-gqa behind"
fi
# A HuggingFace Llama folder in: the independent fixture (grouped-query, head_dim 16, untied).
if run llama_fixture "$LATTICE" convert --from-hf "$SRC/tests/fixtures/hf_llama_tiny" --save ckpt-hf-llama; then
  grep -q 'Llama' llama_fixture.err || fail "convert did not say it read a Llama model"
  grep -q '"num_query_groups": *2' ckpt-hf-llama/iter_0000000/*.json || fail "the converted Llama lost its query groups"
fi
mkdir -p badllama && cp "$SRC/tests/fixtures/hf_llama_tiny/model.safetensors" badllama/ &&
  sed 's/"rope_scaling": null/"rope_scaling": {"factor": 2.0, "rope_type": "dynamic"}/' \
    "$SRC/tests/fixtures/hf_llama_tiny/config.json" > badllama/config.json
expect_error "convert: Llama with dynamic rope_scaling" "badllama/config.json|rope_scaling|dynamic" -- \
  "$LATTICE" convert --from-hf badllama --save ckpt-badllama
[ -e ckpt-badllama ] && fail "a refused Llama convert created --save ckpt-badllama"
expect_error "--num-query-groups 3 of 4 heads" "--num-query-groups 3|--num-attention-heads 4" -- \
  "$LATTICE" "${ROPE[@]}" --group-query-attention --num-query-groups 3 --train-iters 1
if run swiglu_train "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --swiglu --train-iters 1 --save ckpt-swiglu; then
  expect_error "convert: SwiGLU model to HF GPT-2" "--to-hf|SwiGLU|--swiglu" -- \
    "$LATTICE" convert --load ckpt-swiglu --to-hf hf-swiglu
  [ -e hf-swiglu ] && fail "convert --to-hf of a SwiGLU model left hf-swiglu behind"
fi
expect_error "--position-embedding-type alibi" "--position-embedding-type|alibi" -- \
  "$LATTICE" "${ROPE[@]/rope/alibi}" --train-iters 1
# ---- --position-embedding-type none (NoPE): no position table, recorded, resumes only so, generates
# the same with the KV cache as by full recomputation, has no HF form ----
NOPE=("${ROPE[@]/rope/none}")
if run nope_train "$LATTICE" "${NOPE[@]}" --train-iters 3 --exit-interval 2 --save ckpt-nope; then
  grep -qF 'embedding.position_embeddings.weight' ckpt-nope/iter_0000002/*.json &&
    fail "a NoPE checkpoint lists a position table"
  expect_error "resume: NoPE checkpoint, learned positions" "position_embedding_type|--position-embedding-type" -- \
    "$LATTICE" "${ROPE[@]/rope/learned_absolute}" --train-iters 3 --load ckpt-nope
  run nope_gen "$LATTICE" generate --load ckpt-nope --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run nope_gen_full "$LATTICE" generate --load ckpt-nope --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--position-embedding-type none: generate with the KV cache prints what full recomputation prints" \
      nope_gen.out nope_gen_full.out
  expect_error "convert: NoPE to HF" "--to-hf|--position-embedding-type none" -- \
    "$LATTICE" convert --load ckpt-nope --to-hf hf-nope
  [ -e hf-nope ] && fail "convert --to-hf of a NoPE model left hf-nope behind"
fi
# ---- --position-embedding-type yarn: YaRN's fields recorded and resumed by --use-checkpoint-args,
# generation with the KV cache as by full recomputation, out to HF Llama's rope_scaling yarn and back
# generating the same text ----
YARN=("${LLAMA[@]/rope/yarn}" --yarn-rotary-scaling-factor 4 --yarn-original-max-position-embeddings 4
      --no-yarn-correction-range-round-to-int)
if run yarn_train "$LATTICE" "${YARN[@]}" --train-iters 3 --exit-interval 2 --save ckpt-yarn; then
  grep -q '"position_embedding_type": *"yarn"' ckpt-yarn/iter_0000002/*.json &&
    grep -q '"yarn_correction_range_round_to_int": *false' ckpt-yarn/iter_0000002/*.json ||
    fail "the YaRN checkpoint does not record its fields"
  expect_error "resume: YaRN checkpoint, plain rope" "position_embedding_type|--position-embedding-type" -- \
    "$LATTICE" "${LLAMA[@]}" --train-iters 3 --load ckpt-yarn
  run yarn_resume "$LATTICE" train --use-checkpoint-args --micro-batch-size 2 --global-batch-size 2 --lr 1e-2 \
    --mock-data --train-iters 3 --load ckpt-yarn --save ckpt-yarn2 &&
    grep -q '"yarn_rotary_scaling_factor": *4' ckpt-yarn2/iter_0000003/*.json &&
    pass "--use-checkpoint-args resumes the YaRN model"
  run yarn_gen "$LATTICE" generate --load ckpt-yarn --prompt "ab" --max-new-tokens 30 --seed 3 &&
    run yarn_gen_full "$LATTICE" generate --load ckpt-yarn --prompt "ab" --max-new-tokens 30 --seed 3 --no-kv-cache &&
    same "--position-embedding-type yarn: generate with the KV cache prints what full recomputation prints" \
      yarn_gen.out yarn_gen_full.out
  if run yarn_to_hf "$LATTICE" convert --load ckpt-yarn --to-hf hf-yarn; then
    grep -q '"rope_type": "yarn"' hf-yarn/config.json && grep -q '"truncate": false' hf-yarn/config.json &&
      pass "convert --to-hf writes rope_scaling yarn" || fail "convert --to-hf of a YaRN model wrote no rope_scaling yarn"
    run yarn_from_hf "$LATTICE" convert --from-hf hf-yarn --save ckpt-yarn-back &&
      run yarn_gen_back "$LATTICE" generate --load ckpt-yarn-back --prompt "ab" --max-new-tokens 30 --seed 3 &&
      same "lattice -> HF (rope_scaling yarn) -> lattice generates the same text" yarn_gen.out yarn_gen_back.out
  fi
fi
expect_error "YaRN with a partial rotation" "--rotary-percent|yarn" -- \
  "$LATTICE" "${ROPE[@]/rope/yarn}" --yarn-rotary-scaling-factor 4 --train-iters 1
expect_error "--rotary-percent rotating an odd number of dims" "--rotary-percent|rotates 5 dims|even" -- \
  "$LATTICE" "${ROPE[@]/0.5/0.625}" --train-iters 1

e2e_finish
