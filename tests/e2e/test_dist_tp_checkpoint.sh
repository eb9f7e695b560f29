#!/usr/bin/env bash
# Checkpoints under tensor parallelism: a run saved at TP=2 (each rank's part of every
# parameter and optimizer-state tensor stored as a piece of the global tensor) resumes at
# TP=1, at TP=4 and at TP=2 x DP=2 with the distributed optimizer; the next 10 losses and the
# final parameters equal an uninterrupted TP=2 run's (to 1e-5 relative: only reduction order
# differs). The padded vocabulary differs across these layouts (--vocab-size 64: 128 at
# TP=1, 256 at TP=2, 512 at TP=4). A run saved with sequence parallelism resumes too, and
# `convert` and `generate` (one rank) read a TP=2 checkpoint.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_resume_lib.sh"
BASELINE="TP=2"
cd "$TMP"
write_assembler

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
export OMP_NUM_THREADS=1
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
       --global-batch-size 4 --mock-data --vocab-size 64 --log-interval 1 --eval-iters 0 --lr 1e-3
       --hidden-dropout 0.1 --attention-dropout 0.1 --seed 7 --train-iters 20)

"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --tensor-model-parallel-size 2 --save straight > straight.log 2>&1 ||
  fail "straight TP=2 run failed: $(tail -2 straight.log)"
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --tensor-model-parallel-size 2 --exit-interval 10 --save ckpt > tp2.log 2>&1 ||
  fail "TP=2 run failed: $(tail -2 tp2.log)"
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --tensor-model-parallel-size 2 --sequence-parallel --exit-interval 10 \
  --save ckpt_sp > tp2sp.log 2>&1 || fail "TP=2 sequence-parallel run failed: $(tail -2 tp2sp.log)"
# --tp-comm-overlap (Megatron's overlap of the sequence-parallel gathers and reductions with the GEMMs):
# the same numbers.
"${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --tensor-model-parallel-size 2 --sequence-parallel --exit-interval 10 \
  --tp-comm-overlap > tp2sp_overlap.log 2>&1 || fail "TP=2 --tp-comm-overlap run failed: $(tail -2 tp2sp_overlap.log)"
sp_losses() { grep -o 'lm loss: [^|]*' "$1"; }
[[ -n "$(sp_losses tp2sp.log)" && "$(sp_losses tp2sp_overlap.log)" == "$(sp_losses tp2sp.log)" ]] &&
  pass "--tp-comm-overlap leaves the TP=2 sequence-parallel losses identical" || fail "--tp-comm-overlap changed the losses"
[[ -f ckpt/latest_checkpointed_iteration.txt && -f ckpt_sp/latest_checkpointed_iteration.txt ]] ||
  fail "the TP=2 runs wrote no checkpoint"
# Each split tensor is stored as two pieces of its global shape (the padded vocabulary of TP=2).
python3 - ckpt/iter_0000010/checkpoint.json <<'PY' || fail "ckpt/iter_0000010/checkpoint.json: unexpected TP=2 pieces"
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
assert t["embedding.word_embeddings.weight"]["shape"] == [256, 32], t["embedding.word_embeddings.weight"]["shape"]
assert len(t["embedding.word_embeddings.weight"]["pieces"]) == 2
assert len(t["optimizer.exp_avg.decoder.layers.0.mlp.linear_fc2.weight"]["pieces"]) == 2
assert len(t["decoder.final_layernorm.weight"]["pieces"]) == 1  # duplicated: stored once
PY

resume "TP=2 -> TP=1" ckpt 1
resume "TP=2 -> TP=4" ckpt 4 --tensor-model-parallel-size 4
resume "TP=2 -> TP=2xDP=2 distributed optimizer" ckpt 4 --tensor-model-parallel-size 2 --use-distributed-optimizer
resume "TP=2 sequence parallel -> TP=4 sequence parallel" ckpt_sp 4 --tensor-model-parallel-size 4 --sequence-parallel
grep -q "padded vocab 128" "TP=2 -> TP=1.log" && grep -q "padded vocab 512" "TP=2 -> TP=4.log" ||
  fail "the resumed runs did not use the padded vocabulary of their own layout"

# The single-rank tools on a TP=2 checkpoint: convert to HF and back, generation from both.
BYTE=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-2 --log-interval 1 --eval-iters 0
      --seed 7 --mock-data --tokenizer-type ByteTokenizer --tensor-model-parallel-size 2)
GEN=(--prompt "In the beginning" --max-new-tokens 12 --temperature 0.9 --top-k 50 --seed 5)
if "${MPIRUN[@]}" -np 2 "$LATTICE" "${BYTE[@]}" --save byte > byte.log 2>&1 &&
   "$LATTICE" convert --load byte --to-hf hf > convert.log 2>&1 &&
   "$LATTICE" convert --from-hf hf --save byte1 >> convert.log 2>&1 &&
   "$LATTICE" generate --load byte "${GEN[@]}" > gen_tp2.out 2> gen_tp2.err &&
   "$LATTICE" generate --load byte1 "${GEN[@]}" > gen_tp1.out 2> gen_tp1.err; then
  [[ -s gen_tp2.out ]] && cmp -s gen_tp2.out gen_tp1.out && pass "convert and generate read a TP=2 checkpoint" ||
    fail "generation from the TP=2 checkpoint differs from its HF round trip's"
else
  fail "convert/generate on a TP=2 checkpoint failed: $(tail -2 byte.log convert.log gen_tp2.err gen_tp1.err 2>/dev/null)"
fi
# A Llama-form model: --to-hf streams, each HF tensor read from the TP=2 checkpoint's pieces (and its padded
# vocabulary of two ranks) as it is written; back from HF, the same text.
LLAMA=(--normalization RMSNorm --swiglu --disable-bias-linear --position-embedding-type rope
       --untie-embeddings-and-output-weights --num-query-groups 2)
if "${MPIRUN[@]}" -np 2 "$LATTICE" "${BYTE[@]}" "${LLAMA[@]}" --save llama > llama.log 2>&1 &&
   "$LATTICE" convert --load llama --to-hf llama_hf > llama_convert.log 2>&1 &&
   "$LATTICE" convert --from-hf llama_hf --save llama1 >> llama_convert.log 2>&1 &&
   "$LATTICE" generate --load llama "${GEN[@]}" > llama_tp2.out 2> llama_tp2.err &&
   "$LATTICE" generate --load llama1 "${GEN[@]}" > llama_tp1.out 2> llama_tp1.err; then
  [[ -s llama_tp2.out ]] && cmp -s llama_tp2.out llama_tp1.out && grep -q "(Llama" llama_convert.log &&
    pass "a TP=2 Llama-form checkpoint streams to HF and back: the same text" ||
    fail "the TP=2 Llama-form checkpoint's streamed HF round trip changed the text"
else
  fail "convert/generate on a TP=2 Llama-form checkpoint failed: $(tail -2 llama.log llama_convert.log 2>/dev/null)"
fi
e2e_finish
