#!/usr/bin/env bash
# lattice convert --to-megatron as a user runs it: a model lattice trained, written as Megatron-LM's own
# checkpoint for 2 tensor- x 2 pipeline-parallel ranks, then checked by Python's own zipfile and pickle modules
# (tests/e2e/megatron_checkpoint_reference.py: every record's CRC, the pickle as torch.load would rebuild it,
# Megatron's args, each rank's tensor names and shapes, and every value against the lattice checkpoint's
# model.safetensors, reassembled from the ranks as Megatron splits them), by torch.load where PyTorch is
# installed, and read back by --from-megatron (the same weights); bad input: one-line errors, nothing written.
#   bash tests/e2e/test_convert_to_megatron.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

# A tiny SwiGLU model with rope, grouped queries and untied output (4 layers: 2 per stage).
run train "$LATTICE" train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --group-query-attention \
  --num-query-groups 2 --swiglu --ffn-hidden-size 64 --position-embedding-type rope --normalization RMSNorm \
  --disable-bias-linear --untie-embeddings-and-output-weights --seq-length 16 --max-position-embeddings 16 \
  --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-2 --seed 3 --mock-data \
  --tokenizer-type ByteTokenizer --save ckpt || e2e_finish

if run to_mcore "$LATTICE" convert --load ckpt --to-megatron mcore --target-tensor-parallel-size 2 \
     --target-pipeline-parallel-size 2; then
  grep -qF "tensor-parallel 2, pipeline-parallel 2, expert-parallel 1, transformer_engine layer spec" to_mcore.err &&
    grep -qF "Megatron-LM has no ByteTokenizer" to_mcore.err && pass "--to-megatron says what it wrote" ||
    fail "--to-megatron's summary: $(cat to_mcore.err)"
  if /usr/bin/python3 "$SRC/tests/e2e/megatron_checkpoint_reference.py" mcore ckpt/iter_0000002/model.safetensors \
       2 2 >check.out 2>&1; then
    pass "Python's zipfile and pickle read every rank file; names, shapes and values as Megatron splits them"
  else
    fail "megatron_checkpoint_reference.py: $(tail -3 check.out)"
  fi
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    if /usr/bin/python3 -c '
import sys, torch
for r in ("mp_rank_00_000", "mp_rank_01_001"):
    s = torch.load("mcore/release/%s/model_optim_rng.pt" % r)
    assert s["args"].tensor_model_parallel_size == 2 and s["checkpoint_version"] == 3.0
    assert s["model"]["decoder.layers.0.self_attention.linear_qkv.weight"].dtype == torch.float32
' 2>torch.err; then pass "torch.load reads the rank files"; else fail "torch.load: $(tail -2 torch.err)"; fi
  else
    echo "skipped: torch.load (no PyTorch here; scripts/install-deps.sh --bench installs it)"
  fi
  # Read back and written again: the same files, byte for byte.
  if run back "$LATTICE" convert --from-megatron mcore --save ckpt_back &&
     run again "$LATTICE" convert --load ckpt_back --to-megatron mcore2 --target-tensor-parallel-size 2 \
       --target-pipeline-parallel-size 2; then
    same=1
    for f in mcore/release/*/model_optim_rng.pt; do cmp -s "$f" "mcore2/${f#mcore/}" || same=0; done
    [ $same = 1 ] && pass "--from-megatron then --to-megatron writes the same rank files byte for byte" ||
      fail "the rank files written again differ"
  fi
fi
if run local_spec "$LATTICE" convert --load ckpt --to-megatron mcore_local --transformer-impl local; then
  /usr/bin/python3 "$SRC/tests/e2e/megatron_checkpoint_reference.py" mcore_local ckpt/iter_0000002/model.safetensors \
    1 1 >check_local.out 2>&1 && pass "--transformer-impl local, one rank: Python reads the same weights" ||
    fail "megatron_checkpoint_reference.py on the local spec: $(tail -3 check_local.out)"
fi

# ---- bad input: one line naming what is wrong; nothing written ----
expect_error "heads that do not split" "--to-megatron|--tensor-model-parallel-size" -- \
  "$LATTICE" convert --load ckpt --to-megatron bad1 --target-tensor-parallel-size 3
expect_error "no experts to split" "--target-expert-parallel-size 2|experts" -- \
  "$LATTICE" convert --load ckpt --to-megatron bad2 --target-expert-parallel-size 2
expect_error "an unknown layer spec" "--transformer-impl|transformer_engine or local" -- \
  "$LATTICE" convert --load ckpt --to-megatron bad3 --transformer-impl apex
expect_error "a target size without --to-megatron" "--target-*-parallel-size|--to-megatron" -- \
  "$LATTICE" convert --load ckpt --to-hf bad4 --target-tensor-parallel-size 2
expect_error "an existing checkpoint" "--to-megatron|already holds a checkpoint" -- \
  "$LATTICE" convert --load ckpt --to-megatron mcore_local --transformer-impl local
for d in bad1 bad2 bad3 bad4; do [ ! -e "$d" ] || fail "a refused conversion wrote $d"; done
pass "refused conversions wrote nothing"

e2e_finish
