#!/usr/bin/env bash
# Checkpoints under pipeline parallelism: a run saved at TP=2 x PP=2 (each stage's layers,
# the tied embedding once) resumes at one process, at PP=4 (layers redistributed, TP=1) and
# at PP=2 x DP=2 with the distributed optimizer (TP=1) and in the tp-pp-dp rank order
# (--use-tp-pp-dp-mapping); the next 10 losses and the final
# parameters equal an uninterrupted TP=2 x PP=2 run's (to 1e-5 relative). A run saved with
# interleaving and uneven-stage layouts resume at PP=1 too.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_resume_lib.sh"
BASELINE="TP=2 x PP=2"
cd "$TMP"
write_assembler

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
export OMP_NUM_THREADS=1
TRAIN=(train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
       --global-batch-size 4 --mock-data --vocab-size 64 --log-interval 1 --eval-iters 0 --lr 1e-3
       --hidden-dropout 0.1 --attention-dropout 0.1 --seed 7 --train-iters 20)
LAYOUT=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)

"${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" "${LAYOUT[@]}" --save straight > straight.log 2>&1 ||
  fail "straight TP=2 x PP=2 run failed: $(tail -2 straight.log)"
"${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" "${LAYOUT[@]}" --exit-interval 10 --save ckpt > pp2.log 2>&1 ||
  fail "TP=2 x PP=2 run failed: $(tail -2 pp2.log)"
[[ -f ckpt/latest_checkpointed_iteration.txt ]] || fail "the TP=2 x PP=2 run wrote no checkpoint"
# Every layer once, the tied word embedding once (from the first stage), split in 2 by TP.
python3 - ckpt/iter_0000010/checkpoint.json <<'PY' || fail "ckpt/iter_0000010/checkpoint.json: unexpected pieces"
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
for l in range(4):
    assert len(t["decoder.layers.%d.mlp.linear_fc1.weight" % l]["pieces"]) == 2, l
assert len(t["embedding.word_embeddings.weight"]["pieces"]) == 2
assert "output_layer.weight" not in t
assert len(t["decoder.final_layernorm.weight"]["pieces"]) == 1
PY

resume "TP=2 x PP=2 -> one process" ckpt 1
resume "TP=2 x PP=2 -> PP=4" ckpt 4 --pipeline-model-parallel-size 4
resume "TP=2 x PP=2 -> PP=2 x DP=2 distributed optimizer" ckpt 4 --pipeline-model-parallel-size 2 \
  --use-distributed-optimizer
# Megatron's other rank order: ranks 0, 1 one copy's two stages, 2, 3 the other's.
resume "TP=2 x PP=2 -> PP=2 x DP=2 in the tp-pp-dp order" ckpt 4 --pipeline-model-parallel-size 2 \
  --use-tp-pp-dp-mapping
resume "TP=2 x PP=2 -> PP=2 interleaved" ckpt 2 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
resume "TP=2 x PP=2 -> PP=2 interleaved, micro-batches in groups of 4" ckpt 2 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1 --microbatch-group-size-per-virtual-pipeline-stage 4
resume "TP=2 x PP=2 -> PP=2 uneven (1 + 3 layers)" ckpt 2 --pipeline-model-parallel-size 2 \
  --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 3
# The embedding and the loss counted in the split: 4 + 2 over 3 stages is embedding + layer 0,
# layers 1-2, layer 3 + loss (--dry-run says so), and the run goes on as the baseline.
if "${MPIRUN[@]}" -np 3 "$LATTICE" "${TRAIN[@]}" --pipeline-model-parallel-size 3 \
     --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --dry-run > split_dry.log 2>&1 &&
   grep -q "stage 0: embedding + layer 0;" split_dry.log && grep -q "stage 1: layers 1-2;" split_dry.log &&
   grep -q "stage 2: layer 3 + output layer and loss;" split_dry.log; then
  pass "--dry-run: the embedding and loss in the split leave the end stages one layer each"
else
  fail "--dry-run with the embedding and loss in the split: $(grep 'stage [0-9]:' split_dry.log | head -3)"
fi
resume "TP=2 x PP=2 -> PP=3 with the embedding and loss in the split" ckpt 3 --pipeline-model-parallel-size 3 \
  --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
e2e_finish
