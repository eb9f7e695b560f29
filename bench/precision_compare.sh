#!/usr/bin/env bash
# Mixed precision against fp32 on `make train`'s model and corpus (scripts/train-kjv.sh: byte-level KJV,
# L=4 H=4 C=256, T=128, micro-batch 16, global batch 32, lr 1e-3): the same run in fp32, --bf16, --fp16
# (dynamic loss scale, Megatron's defaults) and --bf16 --fp8-format hybrid (delayed scaling; fp8_tensorwise,
# fp8_blockwise and fp8_mxfp8 take the other --fp8-recipe values). Prints each run's final
# loss (the mean of the last log interval), its difference from fp32, skipped iterations and tokens/s.
#
# usage: bench/precision_compare.sh            (after make build; the dataset as make train prepares it)
# environment: ITERS (default 200), MODES (default "fp32 bf16 fp16 fp8"; also fp8_tensorwise, fp8_blockwise,
#              fp8_mxfp8), LATTICE (default build/lattice),
#              DATA_PREFIX (default data/kjv), KEEP=1 keeps the logs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ITERS=${ITERS:-200}
MODES=${MODES:-fp32 bf16 fp16 fp8}
LATTICE=${LATTICE:-build/lattice}
DATA_PREFIX=${DATA_PREFIX:-data/kjv}
dataset=${DATA_PREFIX}_text_document

die() { echo "precision_compare: $*" >&2; exit 1; }
[[ -x $LATTICE ]] || die "$LATTICE not found (make build)"
[[ -s $dataset.bin && -s $dataset.idx ]] || die "$dataset.{bin,idx} not found (run make train once, or scripts/train-kjv.sh)"

work=$(mktemp -d)
if [[ ${KEEP:-0} == 1 ]]; then echo "precision_compare: logs in $work" >&2; else trap 'rm -rf "$work"' EXIT; fi

flags() {
  case $1 in
    fp32) ;;
    bf16) echo --bf16 ;;
    fp16) echo --fp16 ;;
    fp8) echo --bf16 --fp8-format hybrid --fp8-amax-history-len 16 --fp8-amax-compute-algo max ;;
    fp8_tensorwise | fp8_blockwise | fp8_mxfp8) echo --bf16 --fp8-format hybrid --fp8-recipe "${1#fp8_}" ;;
    *) die "unknown mode '$1' (fp32, bf16, fp16, fp8, fp8_tensorwise, fp8_blockwise, fp8_mxfp8)" ;;
  esac
}

for mode in $MODES; do
  echo "precision_compare: $mode ($ITERS iterations)" >&2
  # shellcheck disable=SC2046
  "$LATTICE" train --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \
    --max-position-embeddings 128 --micro-batch-size 16 --global-batch-size 32 --lr 1e-3 --min-lr 1e-3 \
    --train-iters "$ITERS" --log-interval 10 --data-path "$dataset" --tokenizer-type ByteTokenizer \
    --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --weight-decay 0.1 --clip-grad 1.0 \
    --adam-beta2 0.95 --seed 1234 --metrics-file "$work/$mode.jsonl" $(flags "$mode") >"$work/$mode.out" 2>&1 ||
    { tail -n 20 "$work/$mode.out" >&2; die "$mode failed (log above)"; }
done

echo "Measured $(date -u +%F) on $(nproc) CPUs: $ITERS iterations of make train's model per mode."
echo
python3 - "$work" "$MODES" <<'PY'
import json, statistics, sys
work, modes = sys.argv[1], sys.argv[2].split()
rows = {}
for m in modes:
    recs = [json.loads(l) for l in open(f"{work}/{m}.jsonl") if l.strip()]
    recs = [r for r in recs if "lm_loss" in r and "tokens_per_sec" in r]
    last = recs[-1]
    rows[m] = (last["iteration"], last["lm_loss"], sum(r["skipped_iterations"] for r in recs),
               statistics.median(r["tokens_per_sec"] for r in recs[1:] or recs), last["loss_scale"])
print("| mode | iteration | lm loss (last interval) | vs fp32 | skipped iterations | final loss scale | tokens/s (median) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for m, (it, loss, skipped, tps, scale) in rows.items():
    diff = f"{100.0 * (loss - rows['fp32'][1]) / rows['fp32'][1]:+.2f}%" if "fp32" in rows else "-"
    print(f"| {m} | {it} | {loss:.4f} | {diff} | {skipped} | {scale:g} | {tps:.0f} |")
PY
