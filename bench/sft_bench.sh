#!/usr/bin/env bash
# What --sft's data costs a training step: the same model trained on the same number of tokens a step
# from --mock-data (pretraining samples) and from --sft (conversations through a chat template, packed
# each step as the micro-batches are read: the template rendered 1 + 2 x assistant turns times per
# conversation, the text tokenized, masks and segments made). Shape: L=4 H=4 C=256 B=8 T=128 with
# ByteTokenizer's vocabulary; 1000 conversations of one to three exchanges, about 60-300 bytes each; the
# ChatML-like template of tests/fixtures/sft. One table row per run: the median step time of STEPS steps
# after WARMUP and the tokens (all B x T, padding included) a second.
#
# usage: bench/sft_bench.sh
# environment: LATTICE (default build/lattice), STEPS (20), WARMUP (3), ROUNDS (1; runs of each, alternating)
# Threads: whatever OMP_NUM_THREADS says (default: all cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LATTICE=${LATTICE:-build/lattice}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
ROUNDS=${ROUNDS:-1}
[[ -x $LATTICE ]] || { echo "sft_bench: $LATTICE not found (make build)" >&2; exit 1; }
LATTICE=$(realpath "$LATTICE")
SRC=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lattice-sftbench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
python3 - <<'PY'
import json, random
random.seed(7)
words = "the of and to in a is that for it as was with be by on not he I this are or his from at which".split()
def text(n): return " ".join(random.choice(words) for _ in range(n))
with open("chat.jsonl", "w") as f:
    for i in range(1000):
        m = [{"role": "system", "content": "You are helpful."}]
        for _ in range(random.randint(1, 3)):
            m += [{"role": "user", "content": text(random.randint(3, 12))},
                  {"role": "assistant", "content": text(random.randint(5, 30))}]
        f.write(json.dumps({"messages": m}) + "\n")
PY
MODEL=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
       --micro-batch-size 8 --global-batch-size 8 --lr 1e-4 --log-interval 1 --eval-iters 0
       --train-iters $((STEPS + WARMUP)) --metrics-file m.jsonl)
median_ms() {  # the metrics file's step times after WARMUP: their median in ms
  python3 - "$1" "$WARMUP" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"lm_loss"' in l]
t = [r["elapsed_ms"] for r in rows]
print("%.1f" % statistics.median(t[int(sys.argv[2]):]))
PY
}
printf '| run | median step ms | tokens/s |\n|---|---:|---:|\n'
for round in $(seq "$ROUNDS"); do
  for mode in mock sft; do
    if [[ $mode == mock ]]; then
      "$LATTICE" train "${MODEL[@]}" --mock-data --vocab-size 257 >log 2>&1
    else
      "$LATTICE" train "${MODEL[@]}" --sft --data-path chat.jsonl --chat-template "$SRC/tests/fixtures/sft/chat.jinja" \
        --tokenizer-type ByteTokenizer --split 100,0,0 >log 2>&1
    fi
    ms=$(median_ms m.jsonl)
    printf '| %s (round %d) | %s | %.0f |\n' "$mode" "$round" "$ms" "$(echo "8 * 128 * 1000 / $ms" | bc -l)"
  done
done
