#!/usr/bin/env bash
# Serving speed of `lattice serve`: CLIENTS clients at once, each sending REQUESTS Megatron PUT /api
# requests of one prompt (16 bytes) and NEW_TOKENS new tokens, one after another, to a server with
# --batch-size 1 (requests decoded one at a time) and --batch-size CLIENTS (requests waiting together
# decoded together). Model: GPT-2 124M-shaped (L=12 H=12 C=768, vocab 50257, 1024 positions), random
# weights (one training step on mock data), ByteTokenizer prompts, sampling at temperature 1.
# The table: per server, the wall time from the first request to the last answer, the new tokens of
# every answer, and their rate; the median request latency.
#
# usage: bench/serve_bench.sh
# environment:
#   LATTICE     the binary (default build/lattice)
#   CLIENTS     concurrent clients (default 8)      REQUESTS   requests per client (default 2)
#   NEW_TOKENS  tokens_to_generate (default 64)     BATCHES    server --batch-size values (default "1 $CLIENTS")
#   ROUNDS      runs of each server, alternating (default 1); one table row per run
#   KEEP=1      keep the work folder (checkpoint ~500 MB, logs; its path is printed)
# Threads: whatever OMP_NUM_THREADS says (default: all cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

LATTICE=${LATTICE:-build/lattice}
CLIENTS=${CLIENTS:-8}
REQUESTS=${REQUESTS:-2}
NEW_TOKENS=${NEW_TOKENS:-64}
BATCHES=${BATCHES:-1 $CLIENTS}
ROUNDS=${ROUNDS:-1}

die() { echo "serve_bench: $*" >&2; exit 1; }
[[ -x $LATTICE ]] || die "$LATTICE not found (make build)"
LATTICE=$(realpath "$LATTICE")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lattice-servebench.XXXXXX")
PID=
cleanup() {
  [[ -n $PID ]] && kill "$PID" 2>/dev/null || true
  [[ ${KEEP:-0} == 1 ]] && echo "work folder: $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

"$LATTICE" train --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 32 \
  --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 \
  --lr 1e-4 --min-lr 1e-4 --mock-data --vocab-size 50257 --hidden-dropout 0 --attention-dropout 0 \
  --eval-iters 0 --seed 1234 --save "$WORK/ckpt" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log" >&2; die "train failed"; }

printf '| server | clients x requests | new tokens | wall s | new tokens/s | median request s |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
for ((r = 0; r < ROUNDS; ++r)); do
  for batch in $BATCHES; do
    log="$WORK/serve_$batch.$r.err"
    "$LATTICE" serve --load "$WORK/ckpt" --tokenizer-type ByteTokenizer --port 0 --batch-size "$batch" 2>"$log" &
    PID=$!
    for _ in $(seq 1 600); do grep -qE 'on http://[0-9.]+:[0-9]+' "$log" && break; sleep 0.1; done
    port=$(grep -oE 'http://[0-9.]+:[0-9]+' "$log" | head -n 1 | sed 's/.*://')
    [[ -n $port ]] || die "the server did not start: $(cat "$log")"
    row=$(python3 - "$port" "$CLIENTS" "$REQUESTS" "$NEW_TOKENS" <<'PY'
import json, statistics, sys, threading, time, urllib.request
port, clients, requests, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
made, latencies, lock = [0], [], threading.Lock()
def client(c):
    for k in range(requests):
        body = json.dumps({"prompts": ["The quick brown "], "tokens_to_generate": new,
                           "random_seed": 1000 * c + k}).encode()
        req = urllib.request.Request("http://127.0.0.1:%s/api" % port, data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as r:
            answer = json.loads(r.read())
        with lock:
            latencies.append(time.perf_counter() - t0)
            made[0] += len(answer["tokens"][0]) - len("The quick brown ")
t0 = time.perf_counter()
threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.perf_counter() - t0
print("%d x %d | %d | %.2f | %.1f | %.2f" % (clients, requests, made[0], wall, made[0] / wall,
                                             statistics.median(latencies)))
PY
)
    kill -TERM "$PID"
    wait "$PID" || true
    PID=
    printf '| --batch-size %s | %s |\n' "$batch" "$row"
  done
done
