#!/usr/bin/env bash
# lattice convert --to-megatron and --from-megatron on a 165M-parameter Llama-form model (8 layers, hidden 1024,
# vocabulary 32000, untied; 661 MB of fp32) for TP x PP ranks: seconds and peak resident memory (/usr/bin/time),
# the median of ROUNDS, beside PyTorch reading the same rank files (torch.load of each, every tensor made whole
# as a converter must; where PyTorch is installed: scripts/install-deps.sh --bench).
#   LATTICE=build/lattice ROUNDS=3 TP=2 PP=2 bench/megatron_convert.sh
set -euo pipefail
LATTICE=$(realpath "${LATTICE:-build/lattice}")
ROUNDS=${ROUNDS:-3}
TP=${TP:-2}
PP=${PP:-2}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"

"$LATTICE" train --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 64 \
  --max-position-embeddings 64 --vocab-size 32000 --normalization RMSNorm --swiglu --disable-bias-linear \
  --position-embedding-type rope --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 1 \
  --lr 1e-4 --mock-data --eval-iters 0 --train-iters 1 --save ck >/dev/null 2>&1

cat >torch_read.py <<'EOF'
import glob, sys, torch
files = sorted(glob.glob("mcore/release/mp_rank_*/model_optim_rng.pt"))
parts = {}
for f in files:
    for k, v in torch.load(f)["model"].items():
        if torch.is_tensor(v) and not k.endswith("_extra_state"):
            parts.setdefault(k, []).append(v)
whole = {k: (torch.cat(v, 0) if len(v) > 1 else v[0]) for k, v in parts.items()}
print(sum(t.numel() for t in whole.values()))
EOF
torch=0
/usr/bin/python3 -c "import torch" 2>/dev/null && torch=1

# measure NAME CMD...: appends "seconds peak_MB" to NAME.txt
measure() {
  local name=$1
  shift
  /usr/bin/time -f "%e %M" -o t.txt "$@" >/dev/null 2>&1
  read -r s kb <t.txt
  echo "$s $((kb / 1024))" >>"$name.txt"
}
median() { sort -n -k"$2" "$1.txt" | awk -v k="$2" '{ v[NR] = $k } END { print v[int((NR + 1) / 2)] }'; }

for _ in $(seq "$ROUNDS"); do
  rm -rf mcore back
  measure to "$LATTICE" convert --load ck --to-megatron mcore --target-tensor-parallel-size "$TP" \
    --target-pipeline-parallel-size "$PP"
  measure from "$LATTICE" convert --from-megatron mcore --save back
  [ "$torch" = 1 ] && measure torch /usr/bin/python3 torch_read.py
done
echo "| command (TP $TP, PP $PP; median of $ROUNDS) | seconds | peak RSS MB |"
echo "|---|---:|---:|"
echo "| lattice convert --load ck --to-megatron mcore | $(median to 1) | $(median to 2) |"
echo "| lattice convert --from-megatron mcore --save back | $(median from 1) | $(median from 2) |"
if [ "$torch" = 1 ]; then
  echo "| python3: torch.load of every rank file, tensors made whole | $(median torch 1) | $(median torch 2) |"
else
  echo "| (PyTorch not installed: no side-by-side run) | | |"
fi
