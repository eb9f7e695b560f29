#!/usr/bin/env bash
# --device cuda without a GPU, through the CUDA emulation (LATTICE_EMULATE_CUDA=1, docs/cuda.md):
# the whole CUDA code path above the kernels runs with device memory the host cannot touch
# outside kernels and copies, and the CPU kernels inside them, so every result must be
# BIT-IDENTICAL to --device cpu:
#   - training on a preprocessed corpus (dropout, evaluation, a checkpoint): the same log
#     lines (all but the timings), validation losses, final parameters and optimizer state;
#   - a checkpoint saved under --device cuda resumed by --device cpu (and the reverse)
#     continues exactly as the uninterrupted run;
#   - generate --device cuda prints the CPU's text (with the KV cache, the default, and with
#     --no-kv-cache);
#   - --bf16, and the distributed optimizer's checkpoint with --log-memory, give the CPU's results too;
# and the device errors: a bad --device, and --device cuda where no GPU can be used (one
# line naming --device, non-zero exit).
#   bash tests/e2e/test_device_emulation.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

# Dropout on and a warmup + cosine schedule: masks, schedule and data position all matter.
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4
      --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 2 --lr-decay-style cosine --lr-decay-iters 40
      --hidden-dropout 0.1 --attention-dropout 0.1 --log-interval 1 --seed 1234 --peak-tflops 1 --num-threads 1)
EMU=(env LATTICE_EMULATE_CUDA=1)

run() {
  local name=$1
  shift
  if ! "$@" >"$name.out" 2>"$name.err"; then
    fail "$name: exited non-zero: $*"
    sed 's/^/    /' "$name.err" | head -n 20 >&2
    return 1
  fi
}

# The deterministic part of the log: iteration lines without their timings, and evaluation lines.
numbers() {
  grep -E '^ iteration |validation|test loss|lm loss value' "$1" |
    sed -E 's/elapsed time per iteration \(ms\): [^|]*\|//; s/throughput per GPU \(TFLOP\/s\/GPU\): [^|]*\|//;
            s/tokens per second: [^|]*\|//; s/MFU: [^|]*\|//'
}

# same NAME A B: the deterministic log lines of two runs are identical (and there are some).
same() {
  local a b
  a=$(numbers "$2")
  b=$(numbers "$3")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    pass "$1 ($(printf '%s\n' "$a" | grep -c '^ iteration ') iteration lines)"
  else
    fail "$1: the log lines differ:"
    diff <(printf '%s\n' "$a") <(printf '%s\n' "$b") | head -n 10 | sed 's/^/    /' >&2
  fi
}

# same_state NAME A B: the parameter and optimizer files of two iteration directories are identical.
same_state() {
  local f ok=1
  for f in model.safetensors optimizer.safetensors; do
    if [ ! -s "$2/$f" ] || [ ! -s "$3/$f" ]; then
      fail "$1: missing $2/$f or $3/$f"
      ok=0
    elif ! cmp -s "$2/$f" "$3/$f"; then
      fail "$1: $2/$f and $3/$f differ"
      ok=0
    fi
  done
  [ "$ok" -eq 1 ] && pass "$1"
}

# ---- a ByteTokenizer corpus with a validation split ----
for i in $(seq 1 40); do
  printf '{"text": "ab ab abc %d: the quick brown fox jumps over the lazy dog"}\n' "$i"
done >corpus.jsonl
run prep "$LATTICE" preprocess --input corpus.jsonl --json-keys text --tokenizer-type ByteTokenizer \
  --output-prefix corpus --append-eod || e2e_finish
DATA=(--data-path corpus_text_document --tokenizer-type ByteTokenizer --split 90,10,0
      --eval-interval 3 --eval-iters 1)

# ---- 6 iterations on the CPU and on the emulated GPU ----
run cpu "$LATTICE" train "${BASE[@]}" "${DATA[@]}" --train-iters 6 --save cpu --device cpu
run emu "${EMU[@]}" "$LATTICE" train "${BASE[@]}" "${DATA[@]}" --train-iters 6 --save emu --device cuda
if grep -q '^> device: cuda (emulated on the CPU)' emu.out && grep -q '^> device: cpu' cpu.out; then
  pass "the log names the device"
else
  fail "the log does not name the device: $(grep -h '^> device' cpu.out emu.out | tr '\n' ' ')"
fi
grep -q 'validation loss' cpu.out || fail "the runs logged no validation loss"
same "--device cuda (emulated) logs the CPU's losses, grad norms and validation losses" cpu.out emu.out
same_state "--device cuda (emulated) ends with the CPU's parameters and optimizer state" \
  cpu/iter_0000006 emu/iter_0000006

# ---- stop after 3 on one device, resume on the other ----
run emu3 "${EMU[@]}" "$LATTICE" train "${BASE[@]}" "${DATA[@]}" --train-iters 6 --save e2c --exit-interval 3 \
  --device cuda
run e2c "$LATTICE" train "${BASE[@]}" "${DATA[@]}" --train-iters 6 --save e2c --load e2c --device cpu
grep -q ' iteration        4/       6 | consumed samples:           16 |' e2c.out ||
  fail "--device cpu did not resume the --device cuda checkpoint at iteration 4"
numbers cpu.out | grep -A 1000 ' iteration        4/' >cpu_tail.txt
numbers e2c.out >e2c_tail.txt
if [ -s cpu_tail.txt ] && cmp -s cpu_tail.txt e2c_tail.txt; then
  pass "a --device cuda checkpoint resumed on the CPU continues as the uninterrupted run"
else
  fail "a --device cuda checkpoint resumed on the CPU differs from the uninterrupted run:"
  diff cpu_tail.txt e2c_tail.txt | head -n 6 | sed 's/^/    /' >&2
fi
same_state "... and ends with its parameters and optimizer state" cpu/iter_0000006 e2c/iter_0000006

run cpu3 "$LATTICE" train "${BASE[@]}" "${DATA[@]}" --train-iters 6 --save c2e --exit-interval 3 --device cpu
run c2e "${EMU[@]}" "$LATTICE" train "${BASE[@]}" "${DATA[@]}" --train-iters 6 --save c2e --load c2e --device cuda
numbers c2e.out >c2e_tail.txt
if [ -s cpu_tail.txt ] && cmp -s cpu_tail.txt c2e_tail.txt; then
  pass "a CPU checkpoint resumed under --device cuda continues as the uninterrupted run"
else
  fail "a CPU checkpoint resumed under --device cuda differs from the uninterrupted run:"
  diff cpu_tail.txt c2e_tail.txt | head -n 6 | sed 's/^/    /' >&2
fi
same_state "... and ends with its parameters and optimizer state" cpu/iter_0000006 c2e/iter_0000006

# ---- generate on the emulated GPU ----
for mode in kv full; do
  extra=()
  [ "$mode" = full ] && extra=(--no-kv-cache)
  GEN=(generate --load cpu --prompt "ab ab" --max-new-tokens 24 --temperature 0.8 --top-k 20 --seed 5 "${extra[@]}")
  if run "gen_cpu_$mode" "$LATTICE" "${GEN[@]}" --device cpu &&
     run "gen_emu_$mode" "${EMU[@]}" "$LATTICE" "${GEN[@]}" --device cuda; then
    # The default decodes with the KV cache on the device too.
    [ "$mode" = kv ] && { grep -q 'KV cache, cuda emulated' "gen_emu_$mode.err" ||
      fail "generate --device cuda does not decode with the KV cache: $(cat "gen_emu_$mode.err")"; }
    if [ "$(wc -c <"gen_cpu_$mode.out")" -gt 6 ] && cmp -s "gen_cpu_$mode.out" "gen_emu_$mode.out"; then
      pass "generate --device cuda (emulated, $mode) prints the CPU's text"
    else
      fail "generate --device cuda ($mode): '$(cat "gen_emu_$mode.out")' vs the CPU's '$(cat "gen_cpu_$mode.out")'"
    fi
  fi
done

# ---- bf16 ----
MOCK=(--mock-data --vocab-size 64 --eval-iters 0)
run bf_cpu "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --bf16 --train-iters 4 --device cpu
run bf_emu "${EMU[@]}" "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --bf16 --train-iters 4 --device cuda
same "--bf16 --device cuda (emulated) logs the CPU's losses" bf_cpu.out bf_emu.out

# ---- the distributed optimizer's checkpoint path (one rank) and --log-memory ----
run do_cpu "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 3 --use-distributed-optimizer --log-memory \
  --save do_cpu --device cpu
run do_emu "${EMU[@]}" "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 3 --use-distributed-optimizer \
  --log-memory --save do_emu --device cuda
same "--use-distributed-optimizer --log-memory --device cuda (emulated) logs the CPU's losses" do_cpu.out do_emu.out
same_state "... and saves the CPU's parameters and optimizer state" do_cpu/iter_0000003 do_emu/iter_0000003

# ---- two ranks (data parallelism over MPI; the emulation runs unguarded there) ----
if command -v mpirun >/dev/null 2>&1; then
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 2)
  run dp_cpu "${MPIRUN[@]}" "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 3 --device cpu
  run dp_emu "${MPIRUN[@]}" -x LATTICE_EMULATE_CUDA=1 "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 3 \
    --device cuda
  same "two ranks with --device cuda (emulated) log the CPU's losses" dp_cpu.out dp_emu.out
  # Tensor (with sequence) and pipeline parallelism: the model's device copies and staging
  # between ranks (vocab-parallel loss, SP gathers, stage sends, the shared embedding).
  for layout in "tp --tensor-model-parallel-size 2 --sequence-parallel" "pp --pipeline-model-parallel-size 2"; do
    name=${layout%% *}
    read -r -a flags <<<"${layout#* }"
    run "${name}_cpu" "${MPIRUN[@]}" "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 3 "${flags[@]}" --device cpu
    run "${name}_emu" "${MPIRUN[@]}" -x LATTICE_EMULATE_CUDA=1 "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" \
      --train-iters 3 "${flags[@]}" --device cuda
    same "$name on two ranks with --device cuda (emulated) logs the CPU's losses" "${name}_cpu.out" "${name}_emu.out"
  done
fi

# ---- errors ----
expect_error "a bad --device" "--device|cpu or cuda|tpu" -- \
  "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 1 --device tpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pass "a GPU is present: the no-GPU error is not checked here"
else
  expect_error "--device cuda without a GPU" "--device cuda" -- \
    env -u LATTICE_EMULATE_CUDA "$LATTICE" train "${BASE[@]}" "${MOCK[@]}" --train-iters 1 --device cuda
  expect_error "generate --device cuda without a GPU" "--device cuda" -- \
    env -u LATTICE_EMULATE_CUDA "$LATTICE" generate --load cpu --prompt ab --device cuda
fi

e2e_finish
