#!/usr/bin/env bash
# GPT-2 training throughput on one GPU: lattice train --device cuda --bf16 against PyTorch (bf16
# autocast, fused AdamW, flash attention: bench/torch_gpt_bench_cuda.py), shape by shape, on mock
# data, dropout 0, T=1024. Each run does WARMUP unmeasured iterations, then STEPS timed ones.
# lattice's numbers are its own log's (--metrics-file: elapsed time per iteration and Megatron's
# model-FLOP count, src/train/flops.h); PyTorch's script counts FLOPs with the same formula. MFU
# is against PEAK TFLOP/s (989: H100/H200 dense bf16).
#
# usage: bench/gpu_bench.sh [SUMMARY_FILE]     (the table is printed and, if given, written there)
# environment:
#   LATTICE   the binary (default build-gpu/lattice)       PYTHON  interpreter with torch (default python3)
#   SHAPES    from 124m (L12 H12 C768), 350m (L24 H16 C1024), tiny (L2 H2 C64); default "124m 350m"
#   MBS       micro-batch sizes, each its own row with micro-batch = global batch (default "8 32":
#             the small batch shows fixed per-step costs, the larger one what the GEMMs sustain)
#   SEQ       sequence length (default 1024)
#   WARMUP    default 3     STEPS  default 10              PEAK    default 989
#   STEP_TIMEOUT  seconds per run (default 150)            LOGDIR  where the run logs go (default a temp dir)
#   SYSTEMS   default "lattice torch"
#   PROFILE   1 (default): after the table, one more lattice run of the first shape and B with
#             --profile-ops and WARMUP+3 iterations (its own STEP_TIMEOUT); its per-op table is
#             printed and appended to SUMMARY_FILE. 0: no profile run. With PROFILE=1 and
#             PROFILE_FP32_ATTENTION=1 (default) a second profile run has LATTICE_CUDA_ATTENTION=fp32
#             (the fp32 attention kernels instead of the tensor-core ones): the attention rows of the
#             two tables are the measurement that chooses between them.
#   PROFILE_HYBRID  1 (default): last, a --profile-ops run of each of two hybrids, B=1, bf16: a Mamba one
#             (Nemotron-H's layer mix M-M-M*-) and a Gated DeltaNet one (Qwen3-Next's: three GDN layers to
#             one gated attention layer): where their recurrent kernels' time goes next to the GEMMs'. Sizes
#             by HYBRID_SHAPE: real (default; hidden 1024, T=4096, Mamba 32 heads of 64 in 8 groups with
#             state 128, GDN 8 key and 16 value heads of 128) or tiny (hidden 64, T=SEQ). 0: none.
# A run that fails or times out is reported in its row; the others still run. Exit status 0 when
# every benchmark run gave its numbers (the profile run's failure is reported, never counted).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

LATTICE=${LATTICE:-build-gpu/lattice}
PYTHON=${PYTHON:-python3}
SHAPES=${SHAPES:-124m 350m}
MBS=${MBS:-8 32}
SEQ=${SEQ:-1024}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
PEAK=${PEAK:-989}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
SYSTEMS=${SYSTEMS:-lattice torch}
PROFILE=${PROFILE:-1}
PROFILE_FP32_ATTENTION=${PROFILE_FP32_ATTENTION:-1}
PROFILE_HYBRID=${PROFILE_HYBRID:-1}
HYBRID_SHAPE=${HYBRID_SHAPE:-real}
SUMMARY=${1:-}
VOCAB=50257
LOGDIR=${LOGDIR:-$(mktemp -d)}
mkdir -p "$LOGDIR"

dims() {  # shape -> "L H C"
  case $1 in
    124m) echo "12 12 768" ;;
    350m) echo "24 16 1024" ;;
    tiny) echo "2 2 64" ;;  # a smoke test of the script itself
    *) echo "gpu_bench: unknown shape '$1' (124m, 350m or tiny)" >&2; return 1 ;;
  esac
}

# lattice's measured iterations from its metrics file, B -> "tokens/s TFLOP/s MFU ms".
lattice_numbers() {
  "$PYTHON" - "$1" "$WARMUP" "$2" "$SEQ" "$PEAK" <<'PY'
import json, sys
path, warmup, b, t, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "elapsed_ms" in r and r["iteration"] > warmup]
if not rows:
    sys.exit("no measured iterations in " + path)
ms = sum(r["elapsed_ms"] for r in rows) / len(rows)
flops = sum(r["tflops_per_gpu"] * r["elapsed_ms"] for r in rows) / len(rows)  # TFLOP/s x ms = the count
tflops = flops / ms
print(f"{b * t / (ms / 1e3):.0f} {tflops:.1f} {100 * tflops / peak:.1f} {ms:.1f}")
PY
}

lattice_train() {  # L H C B ITERS [more flags] -> runs lattice train on the GPU under STEP_TIMEOUT
  local L=$1 H=$2 C=$3 B=$4 iters=$5
  shift 5
  timeout "$STEP_TIMEOUT" "$LATTICE" train --device cuda --bf16 --mock-data --vocab-size "$VOCAB" \
    --num-layers "$L" --num-attention-heads "$H" --hidden-size "$C" --seq-length "$SEQ" \
    --max-position-embeddings "$SEQ" --micro-batch-size "$B" --global-batch-size "$B" \
    --train-iters "$iters" --log-interval 1 --lr 1e-4 --hidden-dropout 0 --attention-dropout 0 \
    --eval-iters 0 --peak-tflops "$PEAK" "$@"
}

# why_failed RC: " (exit RC)" or " (exit 124: timed out after Ns)".
why_failed() {
  echo " (exit $1$([ "$1" -eq 124 ] && echo ": timed out after ${STEP_TIMEOUT}s"))"
}

# report_failure WHAT RC LOG: a run's failure and the end of its log, on stderr.
report_failure() {
  echo "gpu_bench: $1 failed$(why_failed "$2"); last lines:" >&2
  tail -n 8 "$3" | sed 's/^/    /' >&2
}

run_lattice() {  # shape L H C B -> row fields or FAILED
  local log=$LOGDIR/$1.b$5.lattice
  lattice_train "$2" "$3" "$4" "$5" $((WARMUP + STEPS)) --metrics-file "$log.jsonl" >"$log.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    report_failure "lattice $1 B=$5" "$rc" "$log.out"
    echo "FAILED(exit-$rc)"
    return
  fi
  lattice_numbers "$log.jsonl" "$5" 2>>"$log.out" || echo "FAILED(no-metrics)"
}

run_torch() {  # shape L H C B -> row fields or FAILED
  local log=$LOGDIR/$1.b$5.torch
  timeout "$STEP_TIMEOUT" "$PYTHON" bench/torch_gpt_bench_cuda.py --layers "$2" --heads "$3" --hidden "$4" \
    --seq "$SEQ" --batch "$5" --vocab "$VOCAB" --warmup "$WARMUP" --steps "$STEPS" --peak-tflops "$PEAK" \
    >"$log.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    report_failure "torch $1 B=$5" "$rc" "$log.out"
    echo "FAILED(exit-$rc)"
    return
  fi
  # "torch: tokens/s X | TFLOP/s Y | MFU Z% | step ms W | ..."
  sed -n 's/^torch: tokens\/s \([0-9.]*\) | TFLOP\/s \([0-9.]*\) | MFU \([0-9.]*\)% | step ms \([0-9.]*\).*/\1 \2 \3 \4/p' \
    "$log.out" | tail -n 1 | grep . || echo "FAILED(no-summary)"
}

# "tokens/s TFLOP/s MFU ms" -> aligned columns; FAILED(...) as it is.
fmt() {
  if [[ $1 =~ ^[0-9] ]]; then
    local tps tf mfu ms
    read -r tps tf mfu ms <<<"$1"
    printf '%-9s %-8s %-6s %s' "$tps" "$tf" "$mfu%" "$ms"
  else
    printf '%s' "$1"
  fi
}

# The table is written row by row (to SUMMARY_FILE when given): a run killed later leaves the rows so far.
table=${SUMMARY:-$(mktemp)}
{
  echo "GPT-2 bf16 training, one GPU, T=$SEQ, micro-batch B = global batch, mock data, dropout 0, $WARMUP warm-up + $STEPS timed iterations;"
  echo "TFLOP/s by Megatron's model-FLOP count, MFU against $PEAK TFLOP/s."
} >"$table"
printf '%-6s %4s | %-40s | %-40s | %s\n' "shape" "B" "lattice --device cuda --bf16" "PyTorch bf16 (eager, flash, fused AdamW)" \
  "lattice/torch" >>"$table"
printf '%-6s %4s | %-40s | %-40s | %s\n' "" "" "tokens/s  TFLOP/s  MFU    ms/iter" "tokens/s  TFLOP/s  MFU    ms/iter" \
  "tokens/s" >>"$table"
failures=0
for shape in $SHAPES; do
  d=$(dims "$shape") || { failures=$((failures + 1)); continue; }
  read -r L H C <<<"$d"
  for B in $MBS; do
    lat="skipped"; tor="skipped"
    for s in $SYSTEMS; do
      echo "gpu_bench: $shape (L$L H$H C$C, B=$B T=$SEQ): $s" >&2
      case $s in
        lattice) lat=$(run_lattice "$shape" "$L" "$H" "$C" "$B") ;;
        torch) tor=$(run_torch "$shape" "$L" "$H" "$C" "$B") ;;
      esac
    done
    [[ $lat =~ ^FAILED || $tor =~ ^FAILED ]] && failures=$((failures + 1))
    ratio="-"
    if [[ $lat =~ ^[0-9] && $tor =~ ^[0-9] ]]; then
      ratio=$(awk -v a="${lat%% *}" -v b="${tor%% *}" 'BEGIN { printf "%.2fx", a / b }')
    fi
    printf '%-6s %4s | %-40s | %-40s | %s\n' "$shape" "$B" "$(fmt "$lat")" "$(fmt "$tor")" "$ratio" >>"$table"
  done
done
cat "$table"

# The per-op profile of lattice on the first shape and micro-batch size: the log lines of its --profile-ops table.
profile_lattice() {  # shape L H C B ATTENTION(auto|fp32) -> the table, or one line saying why there is none
  local log=$LOGDIR/$1.b$5.profile-$6
  LATTICE_CUDA_ATTENTION=$6 lattice_train "$2" "$3" "$4" "$5" $((WARMUP + 3)) --profile-ops >"$log.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    report_failure "lattice --profile-ops $1" "$rc" "$log.out"
    echo "profile run failed$(why_failed "$rc"); log: $log.out"
    return
  fi
  sed -n '/^> op profile/,/^> op time per iteration/p' "$log.out" | grep . ||
    echo "profile run printed no table; log: $log.out"
}

first_shape=${SHAPES%% *}
first_b=${MBS%% *}
if [ "$PROFILE" = 1 ] && [[ " $SYSTEMS " == *" lattice "* ]] && d=$(dims "$first_shape" 2>/dev/null); then
  read -r L H C <<<"$d"
  echo "gpu_bench: $first_shape (L$L H$H C$C, B=$first_b T=$SEQ): lattice --profile-ops" >&2
  attentions=auto
  [ "$PROFILE_FP32_ATTENTION" = 1 ] && attentions="auto fp32"
  for attn in $attentions; do
    profile=$(profile_lattice "$first_shape" "$L" "$H" "$C" "$first_b" "$attn")
    {
      echo
      echo "Where lattice's time goes, $first_shape B=$first_b: LATTICE_CUDA_ATTENTION=$attn lattice train --profile-ops, $((WARMUP + 3)) iterations (the first is warm-up);"
      echo "$profile"
    } | tee -a "$table"
  done
fi

# The hybrids' profiles (PROFILE_HYBRID): the recurrent layers' kernels next to the GEMMs.
hybrid_model() {  # KIND (mamba|gdn) -> "description|flags", sized by HYBRID_SHAPE
  local C T A kv heads  # hidden, tokens, attention heads and their dim
  case $HYBRID_SHAPE in
    real) C=1024 T=4096 A=16 kv=64 ;;
    tiny) C=64 T=$SEQ A=4 kv=16 ;;
    *) echo "gpu_bench: unknown HYBRID_SHAPE '$HYBRID_SHAPE' (real or tiny)" >&2; return 1 ;;
  esac
  local common="--hidden-size $C --seq-length $T --max-position-embeddings $T --normalization RMSNorm --disable-bias-linear"
  case $1 in
    mamba)
      [ "$HYBRID_SHAPE" = real ] && heads="32 64 8 128" || heads="4 16 2 16"
      read -r mH mP mG mN <<<"$heads"
      echo "Mamba hybrid M-M-M*-, hidden $C, $mH Mamba heads of $mP, state $mN, T=$T|$common --num-layers 7 \
--hybrid-override-pattern M-M-M*- --num-attention-heads $A --group-query-attention --num-query-groups 2 \
--position-embedding-type none --squared-relu --ffn-hidden-size $((4 * C)) --mamba-num-heads $mH --mamba-head-dim $mP \
--mamba-num-groups $mG --mamba-state-dim $mN" ;;
    gdn)
      [ "$HYBRID_SHAPE" = real ] && heads="8 16 128" || heads="2 4 16"
      read -r kH vH hd <<<"$heads"
      echo "Gated DeltaNet hybrid (3 GDN layers : 1 attention) x 2, hidden $C, $kH key and $vH value heads of $hd, T=$T|$common \
--num-layers 8 --experimental-attention-variant gated_delta_net --linear-attention-freq 4 --linear-num-key-heads $kH \
--linear-num-value-heads $vH --linear-key-head-dim $hd --linear-value-head-dim $hd --num-attention-heads $A \
--group-query-attention --num-query-groups 2 --kv-channels $kv --position-embedding-type rope --swiglu \
--ffn-hidden-size $((3 * C)) --attention-output-gate --qk-layernorm" ;;
  esac
}
if [ "$PROFILE_HYBRID" = 1 ] && [[ " $SYSTEMS " == *" lattice "* ]]; then
  for kind in mamba gdn; do
    model=$(hybrid_model "$kind") || break
    what=${model%%|*}
    read -r -a flags <<<"${model#*|}"
    echo "gpu_bench: $what: lattice --profile-ops" >&2
    log=$LOGDIR/hybrid-$kind.profile
    timeout "$STEP_TIMEOUT" "$LATTICE" train --device cuda --bf16 --mock-data --vocab-size "$VOCAB" "${flags[@]}" \
      --micro-batch-size 1 --global-batch-size 1 --train-iters $((WARMUP + 3)) --log-interval 1 --lr 1e-4 \
      --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --peak-tflops "$PEAK" --profile-ops >"$log.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      report_failure "lattice --profile-ops ($what)" "$rc" "$log.out"
      profile="profile run failed$(why_failed "$rc"); log: $log.out"
    else
      profile=$(sed -n '/^> op profile/,/^> op time per iteration/p' "$log.out" | grep .) ||
        profile="profile run printed no table; log: $log.out"
    fi
    {
      echo
      echo "Where a hybrid's time goes, $what, B=1, bf16: lattice train --profile-ops, $((WARMUP + 3)) iterations;"
      echo "$profile"
    } | tee -a "$table"
  done
fi
echo "logs: $LOGDIR"
[ -n "$SUMMARY" ] || rm -f "$table"
[ "$failures" -eq 0 ]
