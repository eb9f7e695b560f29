#!/usr/bin/env bash
# lattice against PyTorch (Debian's python3-torch, CPU, fp32, dropout 0, AdamW with lr 3e-4 and weight decay 0.1
# on both sides), side by side on one machine.
# Runs alternate (lattice, torch, lattice, torch, ...) so that both see the same noise; the table gives the
# median step time over all measured steps of all rounds and the peak resident memory of each system.
#
# usage: bench/compare_torch.sh            (make bench installs python3-torch and builds lattice first)
# environment:
#   SHAPES   which shapes to run, from: gpt2 (124M: L=12 H=12 C=768 B=4 T=64), small (L=4 H=4 C=256 B=8 T=128),
#            hybrid (a Nemotron-H-style Mamba-2 hybrid, pattern M-M*-M-: L=7 H=8 C=512 B=2 T=1024, Mamba heads
#            of 64 in 8 groups, state 128; RMSNorm, squared ReLU, no linear biases, no position embedding)
#            default "gpt2 small"
#   STEPS    measured steps per run (default 5)      WARMUP  unmeasured steps before them (default 2)
#   ROUNDS   runs of each system per shape (default 2)
#   SYSTEMS  default "lattice lattice_bf16 torch" (lattice_bf16: lattice with --bf16); "torch" alone runs the
#            PyTorch half only
#   LATTICE  the binary (default build/lattice)     TORCH_BENCH  default ../shared/bench/torch_gpt_bench.py
#   TORCH_HYBRID_BENCH  the hybrid shape's PyTorch side (default bench/torch_hybrid_bench.py)
#   PYTHON   an interpreter with torch (default /usr/bin/python3)
#   KEEP=1   keep the run logs (their folder is printed)
# Threads: PyTorch runs with its script's 2 threads and OMP_WAIT_POLICY=PASSIVE; lattice with its own
# policy (docs/threading.md) and whatever OMP_* variables the caller sets.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SHAPES=${SHAPES:-gpt2 small}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
SYSTEMS=${SYSTEMS:-lattice lattice_bf16 torch}
LATTICE=${LATTICE:-build/lattice}
TORCH_BENCH=${TORCH_BENCH:-../shared/bench/torch_gpt_bench.py}
TORCH_HYBRID_BENCH=${TORCH_HYBRID_BENCH:-bench/torch_hybrid_bench.py}
PYTHON=${PYTHON:-/usr/bin/python3}
VOCAB=50257
BLOCK=1024

die() { echo "compare_torch: $*" >&2; exit 1; }
[[ -x /usr/bin/time ]] || die "/usr/bin/time not found (apt-get install time, or scripts/install-deps.sh --bench)"
for s in $SYSTEMS; do
  case $s in
    lattice | lattice_bf16) [[ -x $LATTICE ]] || die "$LATTICE not found (make build)" ;;
    torch) [[ -f $TORCH_BENCH ]] || die "$TORCH_BENCH not found (set TORCH_BENCH)"
           [[ " $SHAPES " != *" hybrid "* || -f $TORCH_HYBRID_BENCH ]] ||
             die "$TORCH_HYBRID_BENCH not found (set TORCH_HYBRID_BENCH)"
           "$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (apt-get install python3-torch)"
           # Debian's PyTorch multiplies through libblas.so.3: the reference BLAS unless OpenBLAS is installed.
           torch_blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
           [[ $torch_blas == */blas/libblas.so.3* ]] &&
             echo "compare_torch: warning: PyTorch's BLAS is the reference BLAS ($torch_blas), 30x slower than OpenBLAS: scripts/install-deps.sh --bench installs OpenBLAS" >&2 ;;
    *) die "unknown system '$s' in SYSTEMS" ;;
  esac
done

work=$(mktemp -d)
if [[ ${KEEP:-0} == 1 ]]; then echo "compare_torch: logs in $work" >&2; else trap 'rm -rf "$work"' EXIT; fi

# shape name -> "L H C B T"
dims() {
  case $1 in
    gpt2) echo "12 12 768 4 64" ;;
    small) echo "4 4 256 8 128" ;;
    hybrid) echo "7 8 512 2 1024" ;;
    *) die "unknown shape '$1' (gpt2, small or hybrid)" ;;
  esac
}
# shape name -> "pattern mamba_head_dim mamba_groups mamba_state" for a hybrid, nothing for a GPT
mamba_dims() {
  case $1 in
    hybrid) echo "M-M*-M- 64 8 128" ;;
  esac
}

# Each run leaves $work/<shape>.<system>.<round>.{out,time}: the program's output and /usr/bin/time -v's report.
run_lattice() {  # shape round L H C B T [system name, extra flags...]
  local base=$work/$1.${8:-lattice}.$2
  /usr/bin/time -v -o "$base.time" "$LATTICE" train --mock-data --vocab-size "$VOCAB" \
    --num-layers "$3" --hidden-size "$5" --num-attention-heads "$4" \
    --seq-length "$7" --max-position-embeddings "$BLOCK" --micro-batch-size "$6" --global-batch-size "$6" \
    --train-iters $((WARMUP + STEPS)) --log-interval 1 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 \
    --lr 3e-4 --lr-decay-style constant --weight-decay 0.1 \
    --metrics-file "$base.metrics.jsonl" "${hybrid_flags[@]}" "${@:9}" >"$base.out" 2>&1 ||
    { tail -n 20 "$base.out" >&2; die "lattice failed on shape $1 (log above)"; }
}
run_lattice_bf16() { run_lattice "$@" lattice_bf16 --bf16; }
run_torch() {  # shape round L H C B T (a hybrid: its script, the pattern for L, the Mamba sizes last)
  local base=$work/$1.torch.$2
  local bench=$TORCH_BENCH layers=$3 mamba=()
  [[ -n $pattern ]] && { bench=$TORCH_HYBRID_BENCH; layers=$pattern; mamba=("$mamba_p" "$mamba_g" "$mamba_n"); }
  OMP_WAIT_POLICY=PASSIVE /usr/bin/time -v -o "$base.time" "$PYTHON" "$bench" "$layers" "$4" "$5" "$6" "$7" \
    "$VOCAB" "$BLOCK" "$STEPS" "$WARMUP" "${mamba[@]}" >"$base.out" 2>&1 ||
    { tail -n 20 "$base.out" >&2; die "torch failed on shape $1 (log above)"; }
}

for shape in $SHAPES; do
  read -r L H C B T <<<"$(dims "$shape")"
  read -r pattern mamba_p mamba_g mamba_n <<<"$(mamba_dims "$shape")"
  hybrid_flags=()  # lattice's flags for the hybrid (Nemotron-H form); Mamba heads 2 C / head dim
  [[ -n $pattern ]] && hybrid_flags=(--hybrid-override-pattern "$pattern" --mamba-head-dim "$mamba_p"
    --mamba-num-groups "$mamba_g" --mamba-state-dim "$mamba_n" --normalization RMSNorm --squared-relu
    --disable-bias-linear --position-embedding-type none)
  for ((r = 1; r <= ROUNDS; r++)); do
    for s in $SYSTEMS; do
      echo "compare_torch: $shape round $r/$ROUNDS: $s" >&2
      "run_$s" "$shape" "$r" "$L" "$H" "$C" "$B" "$T"
    done
  done
done

echo "Measured $(date -u +%F) on $(nproc) CPUs: $STEPS steps after $WARMUP warm-up, $ROUNDS rounds per system${torch_blas:+; PyTorch multiplies with $torch_blas}."
echo
# The table, from the logs: step times of the measured steps of every round, their median, and peak RSS.
"$PYTHON" - "$work" "$WARMUP" "$SHAPES" "$SYSTEMS" <<'EOF'
import glob, json, os, re, statistics, sys

work, warmup, shapes, systems = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
dims = {"gpt2": (12, 12, 768, 4, 64), "small": (4, 4, 256, 8, 128), "hybrid": (7, 8, 512, 2, 1024, "M-M*-M-")}

def peak_rss_mb(path):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
    return int(m.group(1)) / 1024 if m else float("nan")

def lattice_steps_ms(base, tokens):
    steps = []
    for n, line in enumerate(open(base + ".metrics.jsonl"), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if "iteration" not in rec or rec["iteration"] <= warmup:
            continue
        if "elapsed_ms" in rec:
            steps.append(float(rec["elapsed_ms"]))
        elif "tokens_per_sec" in rec:
            steps.append(tokens * 1000.0 / float(rec["tokens_per_sec"]))
        else:
            sys.exit(f"compare_torch: {base}.metrics.jsonl: line {n}: no elapsed_ms or tokens_per_sec")
    return steps

def torch_steps_ms(base):
    m = re.search(r"all=\[([^\]]*)\]", open(base + ".out").read())
    if not m:
        sys.exit(f"compare_torch: {base}.out: no step times in the torch output")
    return [float(x) for x in m.group(1).split(",") if x.strip()]

print("| shape | system | median step ms | tokens/s | ratio vs torch | peak RSS MB |")
print("|---|---|---:|---:|---:|---:|")
for shape in shapes:
    L, H, C, B, T, *pattern = dims[shape]
    rows = {}
    for system in systems:
        steps, rss = [], 0.0
        for base in sorted(p[:-len(".out")] for p in glob.glob(f"{work}/{shape}.{system}.*.out")):
            steps += lattice_steps_ms(base, B * T) if system.startswith("lattice") else torch_steps_ms(base)
            rss = max(rss, peak_rss_mb(base + ".time"))
        if not steps:
            sys.exit(f"compare_torch: no measured steps for {system} on {shape}")
        ms = statistics.median(steps)
        rows[system] = (ms, B * T * 1000.0 / ms, rss, len(steps))
    for system, (ms, tps, rss, n) in rows.items():
        ratio = f"{tps / rows['torch'][1]:.2f}" if "torch" in rows else "-"
        label = f"{shape} ({pattern[0] + ' ' if pattern else ''}L={L} H={H} C={C} B={B} T={T})"
        print(f"| {label} | {system} ({n} steps) | {ms:.0f} | {tps:.0f} | {ratio} | {rss:.0f} |")
EOF
