#!/usr/bin/env bash
# Muon from the command line (--optimizer muon, Megatron's): a Llama-style model trains with the weight
# matrices orthogonalized and its loss falls faster than AdamW's at the same learning rate, with no second
# moment kept for them (the memory report's bytes per parameter under Adam's); the run
# saves its state and resumes to the straight run's losses; a resume with --optimizer adam is refused;
# tensor parallelism runs blockwise (each rank's shards), and with --muon-tp-mode duplicated gives the
# single process's losses; the unimplemented modes and bad values are
# one-line errors naming the flag, with nothing written.
#   bash tests/e2e/test_muon_cli.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear --seq-length 32
       --max-position-embeddings 32 --tokenizer-type ByteTokenizer)
RUN=(--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --seed 3 --mock-data --eval-iters 0)
MUON=(--optimizer muon --muon-momentum 0.95 --muon-use-nesterov)

field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

if run train "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" "${RUN[@]}" --train-iters 24 --exit-interval 20 --save ckpt \
     --metrics-file m.jsonl &&
   run adam "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 20 --metrics-file a.jsonl; then
  first=$(field m.jsonl lm_loss | head -n 1)
  last=$(field m.jsonl lm_loss | tail -n 1)
  adam_last=$(field a.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" -v c="$adam_last" 'BEGIN { exit !(b < a - 0.3 && b < c) }' &&
    pass "Muon trains: lm loss $first -> $last after 20 iterations (AdamW: $adam_last)" ||
    fail "Muon did not train as expected: $first -> $last (AdamW: $adam_last)"
  # Muon's matrices keep no second moment: fewer than Adam's 16 bytes per parameter, as the report expects.
  line=$(grep -h "memory per rank" train.out train.err | head -n 1)
  measured=$(sed -n 's/.*; \([0-9.]*\) bytes per parameter (fp32 expects \([0-9.]*\):.*/\1 \2/p' <<<"$line")
  awk -v m="${measured% *}" -v e="${measured#* }" 'BEGIN { exit !(m != "" && m == e && m < 14) }' &&
    pass "Muon's state: $measured bytes per parameter (measured, expected), under Adam's 16" ||
    fail "Muon's memory line: $line"
  if run resume "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt \
       --metrics-file r.jsonl &&
     run straight "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" "${RUN[@]}" --train-iters 24 --metrics-file s.jsonl; then
    expect_resumed_losses "the resumed run's losses are the straight run's (the momentum saved)" s.jsonl r.jsonl 4
  fi
  expect_error "resume with --optimizer adam" "holds muon state|--optimizer adam" -- \
    "$LATTICE" train "${MODEL[@]}" "${RUN[@]}" --train-iters 24 --load ckpt --save ckpt3
fi

# Tensor parallelism: each rank orthogonalizes its shards (blockwise); the run trains.
if run tp env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${MUON[@]}" "${RUN[@]}" --train-iters 12 --tensor-model-parallel-size 2 --sequence-parallel \
     --metrics-file tp.jsonl; then
  first=$(field tp.jsonl lm_loss | head -n 1); last=$(field tp.jsonl lm_loss | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' &&
    pass "TP 2 (blockwise) trains: $first -> $last" || fail "TP 2 with Muon did not train: $first -> $last"
fi

# --muon-tp-mode duplicated: each matrix gathered and orthogonalized whole on every rank: the single
# process's losses (within fp32 rounding).
if run tp_dup env OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$LATTICE" train \
     "${MODEL[@]}" "${MUON[@]}" --muon-tp-mode duplicated "${RUN[@]}" --train-iters 12 --tensor-model-parallel-size 2 \
     --sequence-parallel --metrics-file dup.jsonl &&
   run one "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" "${RUN[@]}" --train-iters 12 --metrics-file one.jsonl; then
  expect_close_losses "TP 2 with --muon-tp-mode duplicated: the single process's 12 losses" dup.jsonl one.jsonl 12
fi

expect_error "the distributed optimizer" "--optimizer muon does not go with --use-distributed-optimizer" -- \
  "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" --use-distributed-optimizer "${RUN[@]}" --train-iters 1 --save bad1
expect_error "another tensor-parallel mode" "--muon-tp-mode distributed is not implemented" -- \
  "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" --muon-tp-mode distributed "${RUN[@]}" --train-iters 1 --save bad2
expect_error "a bad coefficient type" "--muon-coefficient-type must be simple, quintic, polar_express or aol" -- \
  "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" --muon-coefficient-type cubic "${RUN[@]}" --train-iters 1 --save bad3
expect_error "lion for the scalars" "--muon-scalar-optimizer lion is not implemented" -- \
  "$LATTICE" train "${MODEL[@]}" "${MUON[@]}" --muon-scalar-optimizer lion "${RUN[@]}" --train-iters 1 --save bad4
expect_error "momentum 1" "--muon-momentum must be in [0, 1)" -- \
  "$LATTICE" train "${MODEL[@]}" --optimizer muon --muon-momentum 1 "${RUN[@]}" --train-iters 1 --save bad5
[ -e bad1 ] || [ -e bad2 ] || [ -e bad3 ] || [ -e bad4 ] || [ -e bad5 ] || [ -e ckpt3 ] &&
  fail "a refused run left a checkpoint behind"
e2e_finish
