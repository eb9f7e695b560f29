#!/usr/bin/env bash
# One command for a borrowed GPU (docs/cuda.md): configure and build lattice with the CUDA
# backend for that GPU in build-gpu/, run the GPU tests (ctest -R '^cuda\.'), then the
# throughput benchmark against PyTorch (bench/gpu_bench.sh), and print one summary.
# Meant for an H100/H200 with CUDA 13 and PyTorch with CUDA, no network; under 8 minutes on an H200.
#
# usage: scripts/gpu-check.sh
#        PREBUILT=.gpu-bundle.tar.xz scripts/gpu-check.sh   # binaries built elsewhere (scripts/gpu-bundle.sh):
#          for a GPU machine without Open MPI, oneDNN, GoogleTest and nlohmann-json (the borrowed H200's
#          image); NCCL and cuBLASLt come from its CUDA toolkit or its PyTorch's nvidia-* packages.
# environment:
#   ARCH        CMAKE_CUDA_ARCHITECTURES (default 90)     BUILD  build directory (default build-gpu)
#   JOBS        build parallelism (default nproc)        PYTHON interpreter with torch (default python3)
#   SKIP_BENCH=1  tests only                              OUT    if set, logs and summary go to $OUT/gpu-check/
#   limits (seconds): DEADLINE 470 for the whole script; per step CONFIGURE_TIMEOUT 60,
#   BUILD_TIMEOUT 240, TEST_TIMEOUT 100, BENCH_TIMEOUT 330 (each cut to what is left of the
#   deadline); the benchmark's own limit per run: STEP_TIMEOUT, default 45
#   TEST_CASE_TIMEOUT (default 60): one GPU test, after which it counts as hung (scripts/gtest_resilient.py)
# Every step runs under its limit; a step that fails is reported and the summary still printed.
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

ARCH=${ARCH:-90}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}
DEADLINE=${DEADLINE:-470}
CONFIGURE_TIMEOUT=${CONFIGURE_TIMEOUT:-60}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-240}
TEST_TIMEOUT=${TEST_TIMEOUT:-100}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}
export STEP_TIMEOUT=${STEP_TIMEOUT:-45}
if [ -n "${OUT:-}" ]; then LOGS=$OUT/gpu-check; else LOGS=$ROOT/$BUILD/gpu-check; fi
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
START=$(date +%s)
RESULTS=()   # "step|status|detail"
FAILED=0

# step NAME TIMEOUT LOG CMD...: runs CMD with its output in LOG (and on the console), records the
# result. The limit is cut to what is left of DEADLINE (less 10 s for the summary).
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local t0 rc left
  t0=$(date +%s)
  left=$((DEADLINE - 10 - (t0 - START)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    RESULTS+=("$name|not run (the ${DEADLINE}s deadline is reached)|-")
    FAILED=$((FAILED + 1))
    return 1
  fi
  echo "==== gpu-check: $name (limit ${limit}s) ===="
  timeout "$limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local secs=$(($(date +%s) - t0)) status=ok
  if [ "$rc" -eq 124 ]; then
    status="TIMED OUT after ${limit}s"
  elif [ "$rc" -ne 0 ]; then
    status="FAILED (exit $rc)"
  fi
  [ "$status" = ok ] || FAILED=$((FAILED + 1))
  RESULTS+=("$name|$status|${secs}s")
  echo "==== gpu-check: $name: $status (${secs}s) ===="
  return "$rc"
}

{
  echo "gpu-check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /' ||
    echo "GPU: nvidia-smi failed"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not on PATH')"
  echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n 1)"
  echo "CPU cores: $(nproc)"
} | tee "$LOGS/environment.txt"

# The CUDA libraries lattice loads: the toolkit's, else those PyTorch's wheels bring.
cuda_lib_dirs() {
  local d dirs=()
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
  while read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <("$PYTHON" - <<'PY' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for lib in ("nccl", "cublas", "cuda_runtime", "cu13"):
        for d in glob.glob(os.path.join(base, "nvidia", lib, "lib")) + glob.glob(os.path.join(base, "nvidia", "cu13", "lib")):
            print(d)
PY
)
  (IFS=:; echo "${dirs[*]}")
}

built=0
if [ -n "${PREBUILT:-}" ]; then
  # Binaries from scripts/gpu-bundle.sh: unpack, put their libraries and CUDA's on the path.
  BUNDLE=$ROOT/.gpu-bundle-run
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE"
  if step unpack 60 "$LOGS/unpack.log" tar -C "$BUNDLE" -xJf "$PREBUILT"; then
    export LD_LIBRARY_PATH="$BUNDLE/gpu-bundle/lib:$(cuda_lib_dirs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "bundle: commit $(cat "$BUNDLE/gpu-bundle/COMMIT"); LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$LOGS/environment.txt"
    if step "load check" 30 "$LOGS/ldd.log" bash -c "ldd '$BUNDLE/gpu-bundle/bin/lattice_cuda_tests' | grep -v 'not found' >/dev/null && ! ldd '$BUNDLE/gpu-bundle/bin/lattice_cuda_tests' | grep 'not found' && '$BUNDLE/gpu-bundle/bin/lattice' --help >/dev/null"; then
      built=2
    fi
  fi
elif step configure "$CONFIGURE_TIMEOUT" "$LOGS/configure.log" \
     cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH"; then
  if ! grep -q 'CUDA backend on' "$LOGS/configure.log"; then
    echo "gpu-check: the configure step did not turn the CUDA backend on (see $LOGS/configure.log)"
    RESULTS+=("cuda backend|FAILED (not configured: toolkit or NCCL not found)|-")
    FAILED=$((FAILED + 1))
  elif step build "$BUILD_TIMEOUT" "$LOGS/build.log" \
         cmake --build "$BUILD" -j "$JOBS" --target lattice lattice_cuda_tests; then
    built=1
  fi
fi

if [ "$built" -eq 2 ]; then
  # The gtest binary (no build tree here; its [ info ] lines give the measured differences),
  # through scripts/gtest_resilient.py: a test that crashes, hangs (TEST_CASE_TIMEOUT, default
  # 60 s) or leaves the CUDA context unusable is reported as failed and the others run on in
  # a new process, so one faulting kernel does not hide every later test's result.
  step "cuda tests" "$TEST_TIMEOUT" "$LOGS/cuda-tests.log" \
    bash -c "cd '$ROOT' && python3 scripts/gtest_resilient.py --test-timeout ${TEST_CASE_TIMEOUT:-60} \
             --deadline $((TEST_TIMEOUT - 10)) '$BUNDLE/gpu-bundle/bin/lattice_cuda_tests' --gtest_color=no"
  # Its summary: the lines after its "[==========] ... (scripts/gtest_resilient.py)" line.
  sed -n '/(scripts\/gtest_resilient.py)$/,$p' "$LOGS/cuda-tests.log" > "$LOGS/cuda-tests-summary.txt"
  tests_line=$(grep -E '^\[==========\]|^\[  PASSED  \]|FAILED TEST|^\[  NOT RUN \] [0-9]' "$LOGS/cuda-tests-summary.txt" | tr '\n' ' ')
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$LOGS/cuda-tests-summary.txt")
  failed_names=$(grep -v 'listed below:$' "$LOGS/cuda-tests-summary.txt" |
                 sed -n 's/^\[  FAILED  \] \([^ ]*\).*/\1/p' | sort -u | tr '\n' ' ')
  RESULTS+=("  gtest|${tests_line:-no result line}; skipped: ${skipped:-0}${failed_names:+; failed: $failed_names}|")
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    LOGDIR=$LOGS/bench LATTICE=$BUNDLE/gpu-bundle/bin/lattice PYTHON=$PYTHON \
      step benchmark "$BENCH_TIMEOUT" "$LOGS/bench.log" bash bench/gpu_bench.sh "$LOGS/bench-table.txt"
  fi
elif [ "$built" -eq 1 ]; then
  # ctest -V shows each test's output (the [ info ] lines give the measured differences).
  step "cuda tests" "$TEST_TIMEOUT" "$LOGS/cuda-tests.log" \
    bash -c "cd '$BUILD' && ctest -R '^cuda\\.' -V --timeout 90"
  tests_line=$(grep -E 'tests passed|tests failed' "$LOGS/cuda-tests.log" | tail -n 1)
  skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$LOGS/cuda-tests.log")
  failed_names=$(sed -n 's/^ *[0-9]* - \(cuda\.[^ ]*\) .*/\1/p' "$LOGS/cuda-tests.log" | tr '\n' ' ')
  RESULTS+=("  ctest|${tests_line:-no result line}; skipped: $skipped${failed_names:+; failed: $failed_names}|")
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    LOGDIR=$LOGS/bench LATTICE=$BUILD/lattice PYTHON=$PYTHON \
      step benchmark "$BENCH_TIMEOUT" "$LOGS/bench.log" bash bench/gpu_bench.sh "$LOGS/bench-table.txt"
  fi
else
  RESULTS+=("cuda tests|not run (no build)|-" "benchmark|not run (no build)|-")
fi

{
  echo
  echo "================ gpu-check summary ($(($(date +%s) - START)) s) ================"
  cat "$LOGS/environment.txt"
  echo
  for r in "${RESULTS[@]}"; do
    IFS='|' read -r name status secs <<<"$r"
    printf '%-16s %-8s %s\n' "$name" "$secs" "$status"
  done
  if [ -s "$LOGS/cuda-tests.log" ]; then
    echo
    echo "measured differences (GPU vs CPU):"
    grep -h '^\[ info \]' "$LOGS/cuda-tests.log" | sed 's/^/  /' | sort -u
  fi
  if [ -s "$LOGS/bench-table.txt" ]; then
    echo
    cat "$LOGS/bench-table.txt"
  fi
  echo
  echo "logs: $LOGS"
  [ "$FAILED" -eq 0 ] && echo "gpu-check: all steps passed" || echo "gpu-check: $FAILED step(s) failed"
} | tee "$SUMMARY"
[ "$FAILED" -eq 0 ]
