#!/usr/bin/env bash
# Generation speed of `lattice generate`: the KV cache against a full forward over the context for
# every new token (--no-kv-cache), on a GPT-2 124M-shaped model (L=12 H=12 C=768, vocab 50257 padded
# to 50304, 1024 positions) with random weights (one training step on mock data), prompt 16 tokens,
# 128 new tokens, sampling at temperature 1 with a fixed seed (so both modes produce the same tokens).
# The table gives what `generate` reports on stderr: prefill time and new tokens per second of the
# decode loop (each new token: one sampling plus, except the last, one model step).
#
# SHAPE=hybrid: a Nemotron-H-form hybrid of the same width instead (12 layers M-M-M*-M-M*-: 6 Mamba-2 layers of
# 24 heads of 64, 8 groups, state 128; 2 attention-only and 4 MLP-only layers; RMSNorm, squared ReLU, no
# biases, no position embedding): the cache keeps the 2 attention layers' keys and values and the Mamba
# layers' convolution histories and states.
#
# usage: bench/generate_bench.sh
# environment:
#   LATTICE      the binary (default build/lattice)
#   SHAPE        gpt2 (default) or hybrid
#   NEW_TOKENS   default 128              MODES  default "kv full" (kv: KV cache; full: --no-kv-cache;
#                                         bf16: the KV cache with --bf16, the weights read as bf16;
#                                         kv8: 8 prompts one at a time; batch8: the 8 with --batch-size 8;
#                                         batch8_bf16: and --bf16; penalties: the KV cache with
#                                         --repetition-penalty 1.1 --presence-penalty 0.5, the logits
#                                         adjusted for the text so far before every draw)
#   ROUNDS       runs of each mode, alternating (default 1); the table has one row per run
#   KEEP=1       keep the work folder (checkpoint ~500 MB, logs; its path is printed)
# Threads: whatever OMP_NUM_THREADS says (default: all cores), as for lattice train.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

LATTICE=${LATTICE:-build/lattice}
NEW_TOKENS=${NEW_TOKENS:-128}
MODES=${MODES:-kv full}
ROUNDS=${ROUNDS:-1}
case ${SHAPE:=gpt2} in
  gpt2) SHAPE_FLAGS=() ;;
  hybrid) SHAPE_FLAGS=(--hybrid-override-pattern M-M-M*-M-M*- --mamba-head-dim 64 --mamba-num-groups 8
                       --mamba-state-dim 128 --normalization RMSNorm --squared-relu --disable-bias-linear
                       --position-embedding-type none) ;;
  *) echo "generate_bench: unknown SHAPE '$SHAPE' (gpt2 or hybrid)" >&2; exit 1 ;;
esac
PROMPT="The quick brown "   # 16 bytes = 16 ByteTokenizer tokens

die() { echo "generate_bench: $*" >&2; exit 1; }
[[ -x $LATTICE ]] || die "$LATTICE not found (make build)"
LATTICE=$(realpath "$LATTICE")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lattice-genbench.XXXXXX")
if [[ ${KEEP:-0} == 1 ]]; then echo "work folder: $WORK" >&2; else trap 'rm -rf "$WORK"' EXIT; fi

# A 124M-shaped checkpoint. Trained on mock ids (no tokenizer), so generate is given ByteTokenizer:
# the prompt is bytes, and sampled ids above 255 print nothing; the model's cost is GPT-2's.
"$LATTICE" train --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 32 \
  --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 \
  --lr 1e-4 --min-lr 1e-4 --mock-data --vocab-size 50257 --hidden-dropout 0 --attention-dropout 0 \
  --peak-tflops 1 --eval-iters 0 --seed 1234 "${SHAPE_FLAGS[@]}" --save "$WORK/ckpt" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log" >&2; die "train failed"; }

printf '| mode | prompt tokens | new tokens | prefill ms | decode ms | ms per new token | new tokens/s |\n'
printf '|---|---:|---:|---:|---:|---:|---:|\n'
for _ in 1 2 3 4 5 6 7 8; do echo "$PROMPT"; done >"$WORK/prompts8.txt"
for ((r = 0; r < ROUNDS; ++r)); do
  for mode in $MODES; do
    prompts=(--prompt "$PROMPT")
    case $mode in
      kv) flags=() ; name="KV cache" ;;
      full) flags=(--no-kv-cache) ; name="full forward per token" ;;
      bf16) flags=(--bf16) ; name="KV cache, bf16 weights (--bf16)" ;;
      kv8) flags=() ; name="8 prompts, one at a time" ;;
      batch8) flags=(--batch-size 8) ; name="8 prompts, --batch-size 8" ;;
      batch8_bf16) flags=(--batch-size 8 --bf16) ; name="8 prompts, --batch-size 8 --bf16" ;;
      penalties) flags=(--repetition-penalty 1.1 --presence-penalty 0.5) ; name="KV cache, penalties" ;;
      *) die "unknown mode '$mode' in MODES" ;;
    esac
    [[ $mode == *8* ]] && prompts=(--prompt-file "$WORK/prompts8.txt")
    "$LATTICE" generate --load "$WORK/ckpt" --tokenizer-type ByteTokenizer "${prompts[@]}" \
      --max-new-tokens "$NEW_TOKENS" --temperature 1 --seed 1 "${flags[@]}" \
      >"$WORK/$mode.$r.out" 2>"$WORK/$mode.$r.err" || { cat "$WORK/$mode.$r.err" >&2; die "generate ($mode) failed"; }
    # generate: P prompt(s), prefill 16 tokens in X ms, N new tokens in Y ms (Z tokens/s, ...)
    line=$(grep '^generate:' "$WORK/$mode.$r.err") || die "no timing line from generate ($mode)"
    read -r prompt_tokens prefill_ms new_tokens decode_ms < <(echo "$line" |
      sed -E 's/.*prefill ([0-9]+) tokens in ([0-9.]+) ms, ([0-9]+) new tokens in ([0-9.]+) ms.*/\1 \2 \3 \4/')
    want=$NEW_TOKENS
    [[ $mode == *8* ]] && want=$((8 * NEW_TOKENS))
    [[ $new_tokens == "$want" ]] || echo "generate_bench: $mode stopped after $new_tokens tokens (end of document)" >&2
    awk -v n="$name" -v p="$prompt_tokens" -v t="$new_tokens" -v pf="$prefill_ms" -v d="$decode_ms" \
      'BEGIN { printf "| %s | %d | %d | %.1f | %.1f | %.2f | %.2f |\n", n, p, t, pf, d, d / t, t / (d / 1000) }'
  done
done
if [[ " $MODES " == *" kv "* && " $MODES " == *" full "* ]]; then
  cmp -s "$WORK/kv.0.out" "$WORK/full.0.out" && echo "(both modes generated the same tokens)" ||
    echo "generate_bench: the two modes generated different tokens" >&2
fi
