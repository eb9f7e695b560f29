#!/usr/bin/env bash
# `make train`: the King James Bible -> byte-level dataset -> a small GPT -> checkpoint, loss plot, sample.
# usage: scripts/train-kjv.sh [extra `lattice train` flags]   (every setting below can be overridden
# from the environment, e.g. TRAIN_ITERS=100 scripts/train-kjv.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

LATTICE=${LATTICE:-build/lattice}
DATA_JSONL=${DATA_JSONL:-data/kjv.jsonl}
DATA_PREFIX=${DATA_PREFIX:-data/kjv}            # preprocess writes ${DATA_PREFIX}_text_document.{bin,idx}
RUN_DIR=${RUN_DIR:-runs/kjv}

NUM_LAYERS=${NUM_LAYERS:-4}
HIDDEN_SIZE=${HIDDEN_SIZE:-256}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-4}
SEQ_LENGTH=${SEQ_LENGTH:-128}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-16}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-32}
LR=${LR:-1e-3}
MIN_LR=${MIN_LR:-1e-3}
TRAIN_ITERS=${TRAIN_ITERS:-600}
EVAL_INTERVAL=${EVAL_INTERVAL:-100}
EVAL_ITERS=${EVAL_ITERS:-5}
LOG_INTERVAL=${LOG_INTERVAL:-10}
WEIGHT_DECAY=${WEIGHT_DECAY:-0.1}
CLIP_GRAD=${CLIP_GRAD:-1.0}
ADAM_BETA2=${ADAM_BETA2:-0.95}
SEED=${SEED:-1234}

PROMPT=${PROMPT:-In the beginning}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-200}
SAMPLE_SEED=${SAMPLE_SEED:-1}
TEMPERATURE=${TEMPERATURE:-0.8}
TOP_K=${TOP_K:-40}

checkpoint=$RUN_DIR/checkpoint
metrics=$RUN_DIR/metrics.jsonl
plot=$RUN_DIR/loss.svg
sample=$RUN_DIR/sample.txt
dataset=${DATA_PREFIX}_text_document

[[ -x $LATTICE ]] || { echo "train-kjv: $LATTICE not found; run 'make build' first" >&2; exit 1; }

if [[ ! -s $DATA_JSONL ]]; then
  scripts/kjv-to-jsonl.sh "$DATA_JSONL"
fi
if [[ ! -s $dataset.bin || ! -s $dataset.idx || $DATA_JSONL -nt $dataset.idx ]]; then
  "$LATTICE" preprocess --input "$DATA_JSONL" --json-keys text --tokenizer-type ByteTokenizer \
    --output-prefix "$DATA_PREFIX" --append-eod --workers 2
fi

# A fresh run each time: stale metrics or checkpoints of an earlier run would be mixed into this one.
rm -rf "$checkpoint" "$metrics" "$plot" "$sample"
mkdir -p "$RUN_DIR"
"$LATTICE" train \
  --num-layers "$NUM_LAYERS" --hidden-size "$HIDDEN_SIZE" --num-attention-heads "$NUM_ATTENTION_HEADS" \
  --seq-length "$SEQ_LENGTH" --max-position-embeddings "$SEQ_LENGTH" \
  --micro-batch-size "$MICRO_BATCH_SIZE" --global-batch-size "$GLOBAL_BATCH_SIZE" \
  --lr "$LR" --min-lr "$MIN_LR" --train-iters "$TRAIN_ITERS" --log-interval "$LOG_INTERVAL" \
  --data-path "$dataset" --tokenizer-type ByteTokenizer \
  --hidden-dropout 0 --attention-dropout 0 --eval-interval "$EVAL_INTERVAL" --eval-iters "$EVAL_ITERS" \
  --weight-decay "$WEIGHT_DECAY" --clip-grad "$CLIP_GRAD" --adam-beta2 "$ADAM_BETA2" --seed "$SEED" \
  --save "$checkpoint" --metrics-file "$metrics" \
  "$@"

"$LATTICE" plot --metrics-file "$metrics" --output "$plot"
"$LATTICE" generate --load "$checkpoint" --prompt "$PROMPT" --max-new-tokens "$MAX_NEW_TOKENS" \
  --temperature "$TEMPERATURE" --top-k "$TOP_K" --seed "$SAMPLE_SEED" | tee "$sample"

echo
echo "checkpoint: $checkpoint"
echo "loss plot:  $plot"
echo "sample:     $sample"
