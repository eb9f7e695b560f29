#!/usr/bin/env bash
# Context parallelism from the command line (--context-parallel-size): a run on 4 ranks with every
# sequence split over 2 (DP 2 x CP 2, the distributed optimizer, dropout, evaluation during
# training) equals one process over its first 10 iterations, validation losses included, and saves
# a checkpoint like any other; it resumes at CP 2 on 2 ranks, at CP 4 on 4 and on one process, and
# each resumed run's losses and final parameters equal an uninterrupted single-process run's (to
# 1e-5 relative: only reduction order differs; ckpt_resume_lib.sh). A mixture of experts under CP 2
# equals one process too. The dry run and the memory estimate know the layout. Bad layouts are one-line errors naming the flag, with nothing written.
#   bash tests/e2e/test_dist_cp_checkpoint.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_resume_lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
       --global-batch-size 8 --mock-data --vocab-size 64 --log-interval 1 --lr 1e-3 --eval-interval 3 --eval-iters 1
       --hidden-dropout 0.1 --attention-dropout 0.1 --seed 7 --position-embedding-type rope --num-query-groups 2)
write_assembler
BASELINE="single-process"

OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" --train-iters 20 --save straight > straight.log 2>&1 ||
  fail "straight run failed: $(tail -2 straight.log)"
"${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" --train-iters 20 --exit-interval 10 --use-distributed-optimizer \
  --context-parallel-size 2 --cp-comm-type p2p --save ckpt > cp2.log 2>&1 || fail "CP=2 run failed: $(tail -2 cp2.log)"
[[ -f ckpt/latest_checkpointed_iteration.txt ]] || fail "CP=2 run wrote no checkpoint"
grep -q "parallel layout: world 4 = tp 1 x cp 2 x pp 1 x dp 2" cp2.log && pass "the log names the layout" ||
  fail "no layout line with cp: $(grep 'parallel layout' cp2.log)"
want=$(losses straight.log | head -10 | tr '\n' ' ')
got=$(losses cp2.log | tr '\n' ' ')
close_values 10 "$got" "$want" &&
  pass "DP=2 x CP=2: the first 10 losses equal the single process's" || fail "CP=2 losses '$got', single process '$want'"
vl() { grep 'validation loss' "$1" | grep -o 'lm loss value: [0-9.E+-]*' | awk '{print $NF}' | head -3 | tr '\n' ' '; }
close_values 3 "$(vl cp2.log)" "$(vl straight.log)" &&
  pass "CP=2: the validation losses $(vl cp2.log)equal the single process's" ||
  fail "CP=2 validation losses '$(vl cp2.log)', single process '$(vl straight.log)'"

resume "DP=2 x CP=2 -> CP=2 on 2 ranks" ckpt 2 --train-iters 20 --context-parallel-size 2
resume "DP=2 x CP=2 -> CP=4 on 4 ranks" ckpt 4 --train-iters 20 --context-parallel-size 4 --use-distributed-optimizer
resume "DP=2 x CP=2 -> one process" ckpt 1 --train-iters 20

# Experts under CP 2 (the router's and the experts' biases, the load-balancing loss over both ranks'
# tokens): the losses and the logged load-balancing loss equal one process's.
MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 0.01)
lbl() { grep -o 'load_balancing_loss: [0-9.E+-]*' "$1" | awk '{print $2}' | tr '\n' ' '; }
if OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" "${MOE[@]}" --train-iters 6 > moe1.log 2>&1 &&
   "${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" "${MOE[@]}" --train-iters 6 --context-parallel-size 2 > moe2.log 2>&1; then
  close_values 6 "$(losses moe2.log | tr '\n' ' ')" "$(losses moe1.log | tr '\n' ' ')" &&
    close_values 6 "$(lbl moe2.log)" "$(lbl moe1.log)" &&
    pass "CP=2 with 4 experts: the losses and load-balancing losses $(lbl moe2.log)equal one process's" ||
    fail "CP=2 with experts: losses '$(losses moe2.log | tr '\n' ' ')' lb '$(lbl moe2.log)', one process '$(losses moe1.log | tr '\n' ' ')' lb '$(lbl moe1.log)'"
else
  fail "the MoE runs failed: $(tail -2 moe1.log) $(tail -2 moe2.log)"
fi

# The dry run and the memory estimate under the layout.
OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=0 "$LATTICE" "${TRAIN[@]}" --train-iters 2 --context-parallel-size 2 \
  --dry-run > dry.log 2>&1 || fail "dry run failed: $(tail -2 dry.log)"
grep -q "world 4 = tp 1 x cp 2 x pp 1 x dp 2" dry.log &&
  grep -q "context parallelism: each sequence of 16 tokens in 4 chunks of 4, two per rank over cp 2 ranks" dry.log &&
  pass "the dry run shows the context-parallel split" || fail "dry run without the split: $(head -3 dry.log)"
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 2 --context-parallel-size 2 --log-memory > mem.log 2>&1 ||
  fail "--log-memory run failed: $(tail -2 mem.log)"
grep -q "rank 1 (tp 0, cp 1, pp 0, dp 0)" mem.log && grep -q "measured" mem.log && pass "--log-memory estimates and measures each context-parallel rank" ||
  fail "--log-memory under CP: $(tail -3 mem.log)"

# Bad layouts: one line naming the flag, a non-zero exit, nothing written.
expect_error "sequence not in 2 cp chunks" "--seq-length 16 is not divisible by 2 x --context-parallel-size 3" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --context-parallel-size 3 --save bad1
expect_error "bad cp-comm-type" "--cp-comm-type must be p2p, a2a, allgather or a2a+p2p, got 'ring'" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --cp-comm-type ring --save bad4
expect_error "cp on one process" "world size 1 is not divisible by --tensor-model-parallel-size 1 x --context-parallel-size 2" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --context-parallel-size 2 --save bad5
for d in bad1 bad4 bad5; do [ -e "$d" ] && fail "a refused run wrote $d"; done
e2e_finish
