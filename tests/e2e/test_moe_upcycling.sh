#!/usr/bin/env bash
# Megatron's --moe-use-upcycling: a mixture of experts made from a dense checkpoint. Every expert the
# dense MLP (granularity 1, gates normalized over the top k), the upcycled model's validation loss is the
# dense model's, in one process and under tensor and expert parallelism; the upcycled checkpoint is in
# --save before the first step, and the next run resumes from it without the flag; the errors.
#   bash tests/e2e/test_moe_upcycling.sh <lattice> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

COMMON=(train --num-layers 2 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
        --micro-batch-size 2 --global-batch-size 4 --mock-data --vocab-size 64 --log-interval 1 --lr 1e-3
        --eval-iters 2 --eval-interval 1000 --seed 3)
MODEL=("${COMMON[@]}" --hidden-size 32)
MOE=(--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01)
val_loss() { grep -o 'validation loss at iteration [0-9]* on validation set | lm loss value: [0-9.E+-]*' "$1" | tail -1 | awk '{print $NF}'; }

run dense "$LATTICE" "${MODEL[@]}" --train-iters 3 --save dense || e2e_finish
run dense_eval "$LATTICE" "${MODEL[@]}" --train-iters 3 --load dense --skip-train
want=$(val_loss dense_eval.out)

# Upcycled and evaluated at once (--skip-train): the dense model's function.
if run up "$LATTICE" "${MODEL[@]}" "${MOE[@]}" --train-iters 3 --load dense --save moe --moe-use-upcycling --skip-train; then
  got=$(val_loss up.out)
  grep -q "> upcycled the dense checkpoint dense into 4 experts per MoE layer (granularity 1)" up.out ||
    fail "no upcycling line: $(grep '^>' up.out | head -5)"
  awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * b) }' &&
    pass "the upcycled model's validation loss $got is the dense model's $want" ||
    fail "upcycled validation loss '$got' against the dense model's '$want'"
  [ "$(cat moe/latest_checkpointed_iteration.txt 2>/dev/null)" = 0 ] &&
    python3 - moe/iter_0000000/checkpoint.json <<'EOF' && pass "--save holds the upcycled model (iteration 0, 4 experts a layer)" || fail "the upcycled checkpoint: $(ls moe 2>&1)"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["model_config"]["num_experts"] == 4, j["model_config"]
names = j["tensors"].keys()
for l in range(2):
    for e in range(4):
        assert "decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc1.weight" % (l, e) in names
    assert "decoder.layers.%d.mlp.linear_fc1.weight" % l not in names
EOF
fi

# Any layout reads its own boxes of the dense checkpoint: the same loss under TP 2 and EP 2.
if command -v mpirun >/dev/null 2>&1 && [ -n "$want" ]; then
  for layout in "--tensor-model-parallel-size 2" "--expert-model-parallel-size 2"; do
    rm -rf moe2
    if mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$LATTICE" "${MODEL[@]}" "${MOE[@]}" \
         --train-iters 3 --load dense --save moe2 --moe-use-upcycling --skip-train $layout >two.out 2>&1; then
      got=$(val_loss two.out)
      awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * b) }' &&
        pass "$layout: the upcycled validation loss $got" || fail "$layout: upcycled '$got' against '$want'"
    else
      fail "$layout: $(tail -n 2 two.out)"
    fi
  done
fi

# The next run resumes from the upcycled checkpoint without the flag and trains the experts.
if run resume "$LATTICE" "${MODEL[@]}" "${MOE[@]}" --train-iters 3 --load moe --save moe; then
  grep -q "loaded checkpoint moe (iteration 0" resume.out && grep -q "iteration        3/" resume.out &&
    [ "$(cat moe/latest_checkpointed_iteration.txt)" = 3 ] &&
    pass "the next run resumes from the upcycled checkpoint and trains to iteration 3" ||
    fail "resume from the upcycled checkpoint: $(grep -E 'loaded|iteration  ' resume.out | head -3)"
fi

expect_error "upcycling into a --save that holds a checkpoint" "--moe-use-upcycling: --save moe holds a checkpoint already" -- \
  "$LATTICE" "${MODEL[@]}" "${MOE[@]}" --train-iters 3 --load dense --save moe --moe-use-upcycling
expect_error "upcycling without experts" "--moe-use-upcycling needs --load|--num-experts" -- \
  "$LATTICE" "${MODEL[@]}" --train-iters 3 --load dense --save moe3 --moe-use-upcycling
expect_error "upcycling a mixture of experts" "is a mixture of experts already" -- \
  "$LATTICE" "${MODEL[@]}" "${MOE[@]}" --train-iters 3 --load moe --save moe4 --moe-use-upcycling
expect_error "upcycling another model" "hidden_size" -- \
  "$LATTICE" "${COMMON[@]}" --hidden-size 64 "${MOE[@]}" --train-iters 3 --load dense --save moe5 --moe-use-upcycling
expect_error "a granularity the widths do not give" "--moe-upcycling-granularity 2: the dense --ffn-hidden-size 128 is 1 x" -- \
  "$LATTICE" "${MODEL[@]}" "${MOE[@]}" --train-iters 3 --load dense --save moe6 --moe-use-upcycling \
  --moe-upcycling-granularity 2
[ ! -e moe5 ] && [ ! -e moe6 ] && pass "a refused upcycling writes nothing" || fail "a refused upcycling left $(ls -d moe5 moe6 2>/dev/null)"

e2e_finish
