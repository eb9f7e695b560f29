#!/usr/bin/env bash
# The trainer's whole GPU path, without a GPU: `lattice-simt train --device cuda` (the CLI on
# the SIMT emulation: lattice's CUDA kernels, cuBLASLt and NCCL calls run on the CPU, NCCL's
# communicators over MPI; docs/cuda.md) against `lattice train --device cpu`, for each
# parallel layout: one rank in fp32 with dropout, in bf16, fp16 (loss scaling), fp8 (delayed; mxfp8), with
# full activation recomputation and with the rotary embedding (bf16, with multi-query attention: one
# query group), with grouped-query attention on the tensor-core kernels (bf16), and on a corpus: the
# validation loss, and generation from the CPU's checkpoint (with the KV cache and without;
# learned positions and rotary); under mpirun, tensor parallel, data parallel with the
# distributed optimizer (overlapped reduction and parameter gather) and bf16 gradient
# reduction (without linear biases, with RMSNorm and SwiGLU), pipeline parallel (1F1B, and interleaved), expert
# parallel (a mixture of experts' all-to-all dispatch; whole experts over the tensor-parallel pair), context parallel (gathered keys and values,
# rotary, multi-query, the distributed optimizer over dp x cp; a Gated DeltaNet layer's and a Mamba layer's heads
# split over the pair, with document masks, as one rank runs it too), and tensor x
# pipeline on 4 ranks (rotary, with an attention twice the hidden size), and fp8 tensorwise under
# tensor parallelism. Every iteration's
# loss and gradient norm must agree to 1e-5 relative (fp32: the two backends reduce in
# different orders, ~1e-7 apart; a wrong index, mask, scale or a lost message is 1e-2 or
# more); bf16, fp16 and fp8 to 1e-3 (the GEMMs and the attention round at different places:
# 2e-5 measured over 3 iterations, against a unit roundoff of 4e-3 in bf16). A hang (a
# deadlock between ranks) fails at the time limit. The layouts of several ranks run on the
# emulation twice, in both orders of its streams' independent work
# (tests/simt/simt_streams.h: reads-early catches a read not ordered after its writer,
# writes-early a buffer written before the NCCL operation reading it has completed).
#   bash tests/simt/e2e_parallel_layouts.sh <lattice> <source dir> <lattice-simt>
set -u -o pipefail
source "$(dirname "$0")/../e2e/lib.sh"
e2e_init "$1" "$2"
SIMT=$(realpath "$3")
cd "$TMP" || exit 1

BASE=(--hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --train-iters 3 --log-interval 1 --seed 1234
      --mock-data --vocab-size 96 --make-vocab-size-divisible-by 32 --eval-iters 0
      --hidden-dropout 0.1 --attention-dropout 0.1 --peak-tflops 1 --num-threads 1)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
LIMIT=240  # seconds per run

# run NAME RANKS BINARY DEVICE FLAGS...: the run's metrics in NAME.jsonl (a flag of BASE that FLAGS
# give too takes FLAGS' value)
run() {
  local name=$1 ranks=$2 bin=$3 device=$4 base=() i
  shift 4
  for ((i = 0; i < ${#BASE[@]}; ++i)); do
    local flag=${BASE[i]} value=()
    [[ $((i + 1)) -lt ${#BASE[@]} && ${BASE[i + 1]} != --* ]] && value=("${BASE[i + 1]}") && i=$((i + 1))
    [[ " $* " == *" $flag "* ]] || base+=("$flag" "${value[@]}")
  done
  local cmd=("$bin" train "${base[@]}" "$@" --device "$device" --metrics-file "$name.jsonl")
  [ "$ranks" -gt 1 ] && cmd=("${MPIRUN[@]}" -np "$ranks" "${cmd[@]}")
  local rc=0
  timeout "$LIMIT" "${cmd[@]}" >"$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && fail "$name: no result after ${LIMIT} s (a deadlock?): ${cmd[*]}" ||
      fail "$name: exited $rc: ${cmd[*]}"
    tail -n 5 "$name.log" | sed 's/^/    /' >&2
    return 1
  fi
}

# field FILE KEY: the values of "KEY" in a JSONL file, one per line
field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2; }

# agree NAME TOL [RUN]: NAME-cpu and NAME-RUN (NAME-simt) have the same iterations, losses and
# gradient norms within TOL (relative)
agree() {
  local name=$1 tol=$2 other=$1-${3:-simt} key worst
  for key in lm_loss grad_norm; do
    worst=$(paste <(field "$name-cpu.jsonl" $key) <(field "$other.jsonl" $key) |
      awk -v tol="$tol" 'NF != 2 || $1 == "" { bad = 1 }
        { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = d / (a > 0 ? a : 1); if (r > w) w = r; n++ }
        END { if (bad || n != 3) print "mismatch"; else printf "%.2e\n", w }')
    if [ "$worst" = "mismatch" ]; then
      fail "$other: $key: the runs logged different iterations"
    elif awk -v w="$worst" -v t="$tol" 'BEGIN { exit !(w <= t) }'; then
      pass "$other: $key over 3 iterations within $worst relative (tolerance $tol)"
    else
      fail "$other: $key differs by $worst relative (tolerance $tol)"
      paste <(field "$name-cpu.jsonl" $key) <(field "$other.jsonl" $key) | sed 's/^/    cpu, simt: /' >&2
    fi
  done
}

# layout NAME RANKS TOL FLAGS...: the CPU and the emulated GPU run of one layout
layout() {
  local name=$1 ranks=$2 tol=$3
  shift 3
  [[ " $* " == *" --num-layers "* ]] || set -- --num-layers 2 "$@"
  run "$name-cpu" "$ranks" "$LATTICE" cpu "$@" || return 1
  run "$name-simt" "$ranks" "$SIMT" cuda "$@" && agree "$name" "$tol"
  if [ "$ranks" -gt 1 ]; then
    LATTICE_SIMT_STREAMS=writes-early run "$name-simt-writes-early" "$ranks" "$SIMT" cuda "$@" &&
      agree "$name" "$tol" simt-writes-early
  fi
}

layout one-rank-fp32 1 1e-5
layout one-rank-bf16 1 1e-3 --bf16
layout one-rank-fp16 1 1e-3 --fp16 --initial-loss-scale 4096
layout one-rank-fp8 1 1e-3 --bf16 --fp8-format hybrid
# (one micro-batch a step: the backends accumulate a weight gradient over micro-batches in other fp32
# orders, ~3e-8 apart as in bf16, and a block-scaled fp8 run turns such a difference into rounding flips
# of 2^-4: 1.3e-3 in the gradient norm after 3 iterations with 4 micro-batches)
layout one-rank-fp8-mxfp8 1 1e-3 --bf16 --fp8-format hybrid --fp8-recipe mxfp8 --global-batch-size 2
layout one-rank-bf16-rope-gqa 1 1e-3 --bf16 --position-embedding-type rope --rotary-percent 0.5 \
  --group-query-attention --num-query-groups 1
# grouped-query attention read in place by the tensor-core kernels (head dim 64), the packed bf16
# qkv with its bias
layout one-rank-bf16-gqa-tensor-cores 1 1e-3 --bf16 --kv-channels 64 \
  --group-query-attention --num-query-groups 1
layout one-rank-recompute 1 1e-5 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
# a Gated DeltaNet layer (its step-by-step GPU kernels against the CPU's chunked rule) before an attention layer
GDN=(--swiglu --experimental-attention-variant gated_delta_net --linear-attention-freq 2 --linear-num-key-heads 2
     --linear-num-value-heads 4 --linear-key-head-dim 8 --linear-value-head-dim 8)
layout one-rank-gated-delta-net 1 1e-5 "${GDN[@]}"
if command -v mpirun >/dev/null 2>&1; then
  layout tensor-parallel-2 2 1e-5 --tensor-model-parallel-size 2 --sequence-parallel
  # fp8 tensorwise: each GEMM operand's amax all-reduced over the pair (host buffers through NCCL)
  layout tensor-parallel-2-fp8-tensorwise 2 1e-3 --tensor-model-parallel-size 2 --sequence-parallel --bf16 \
    --fp8-format hybrid --fp8-recipe tensorwise
  layout data-parallel-2-distributed-optimizer 2 1e-5 --use-distributed-optimizer --overlap-grad-reduce \
    --overlap-param-gather
  layout data-parallel-2-bf16-reduce-no-bias-rmsnorm-swiglu 2 1e-3 --bf16 --grad-reduce-in-bf16 --disable-bias-linear \
    --normalization RMSNorm --swiglu
  layout pipeline-2 2 1e-5 --pipeline-model-parallel-size 2
  # the experts' all-to-all token dispatch (grouped NCCL sends and receives), their own buckets
  layout expert-parallel-2-distributed-optimizer 2 1e-5 --num-experts 4 --moe-router-topk 2 --disable-bias-linear \
    --moe-aux-loss-coeff 0.01 --expert-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce
  # whole experts (--expert-tensor-parallel-size 1): the dispatch between the tensor-parallel pair, the
  # routers' gradients all-reduced over it, a shared expert split over it
  layout tensor-2-whole-experts-2 2 1e-5 --tensor-model-parallel-size 2 --sequence-parallel --num-experts 4 \
    --moe-router-topk 2 --disable-bias-linear --moe-aux-loss-coeff 0.01 --expert-model-parallel-size 2 \
    --expert-tensor-parallel-size 1 --moe-shared-expert-intermediate-size 32
  # the keys and values all-gathered and their gradients reduce-scattered over NCCL
  layout context-parallel-2-rope-mqa 2 1e-5 --context-parallel-size 2 --position-embedding-type rope \
    --num-query-groups 1 --use-distributed-optimizer
  # the GDN layer's heads split over the pair: NCCL all-to-alls to each rank's head and back; with document
  # masks (the mock data's eod, its last token id), its state and convolution restarting at each document
  layout context-parallel-2-gated-delta-net-documents 2 1e-5 --context-parallel-size 2 "${GDN[@]}" \
    --reset-attention-mask --reset-position-ids
  # a hybrid's Mamba layer (the GPU's token-by-token scan against the CPU's chunked one) before an attention
  # layer, its 8 heads and 2 groups split over the pair (NCCL all-to-alls), with document masks
  layout context-parallel-2-mamba-documents 2 1e-5 --context-parallel-size 2 --hybrid-override-pattern "M*" \
    --mamba-head-dim 8 --mamba-num-groups 2 --reset-attention-mask --reset-position-ids
  layout pipeline-2-interleaved 2 1e-5 --pipeline-model-parallel-size 2 --num-layers 4 \
    --num-layers-per-virtual-pipeline-stage 1
  layout tensor-2-pipeline-2-rope 4 1e-5 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --position-embedding-type rope --kv-channels 32
else
  fail "mpirun not found: the parallel layouts were not run"
fi
grep -h "device: cuda" one-rank-fp32-simt.log >/dev/null || fail "the emulated run did not select a CUDA device"

# ---- a corpus: validation losses, a checkpoint, generation (the KV cache's kernels) ----
for i in $(seq 1 40); do
  printf '{"text": "ab ab abc %d: the quick brown fox jumps over the lazy dog"}\n' "$i"
done >corpus.jsonl
if "$LATTICE" preprocess --input corpus.jsonl --json-keys text --tokenizer-type ByteTokenizer \
     --output-prefix corpus --append-eod >prep.log 2>&1; then
  CORPUS=(--num-layers 2 --data-path corpus_text_document --tokenizer-type ByteTokenizer --split 90,10,0
          --eval-interval 3 --eval-iters 1)
  TRAIN=(train --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
         --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 3 --log-interval 1 --seed 1234
         --peak-tflops 1 --num-threads 1 "${CORPUS[@]}")
  if "$LATTICE" "${TRAIN[@]}" --device cpu --save ckpt >corpus-cpu.log 2>&1 &&
     timeout "$LIMIT" "$SIMT" "${TRAIN[@]}" --device cuda >corpus-simt.log 2>&1; then
    # The validation losses (during training and at the end): the same count, within 1e-5.
    vloss() { grep 'validation loss' "$1" | grep -o 'lm loss value: [0-9.E+-]*' | awk '{print $NF}'; }
    worst=$(paste <(vloss corpus-cpu.log) <(vloss corpus-simt.log) |
      awk 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > w) w = r; n++ }
           END { if (bad || n < 2) print "mismatch"; else printf "%.2e\n", w }')
    if [ "$worst" != "mismatch" ] && awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }'; then
      pass "validation losses on the emulated GPU within $worst relative of the CPU's"
    else
      fail "validation losses differ ($worst): $(vloss corpus-simt.log | tr '\n' ' ') vs the CPU's $(vloss corpus-cpu.log | tr '\n' ' ')"
    fi
    printf 'ab ab\nthe\nand it was so\n' >three-prompts.txt
    for mode in kv full batch; do
      extra=()
      [ "$mode" = full ] && extra=(--no-kv-cache)
      # batch: three prompts prefilled in one forward (the logits of their last rows gathered), then stepped together.
      [ "$mode" = batch ] && extra=(--prompt-file three-prompts.txt --batch-size 3)
      GEN=(generate --load ckpt --prompt "ab ab" --max-new-tokens 24 --temperature 0.8 --top-k 20 --seed 5 "${extra[@]}")
      if "$LATTICE" "${GEN[@]}" --device cpu >gen-cpu-$mode.out 2>gen-cpu-$mode.err &&
         timeout "$LIMIT" "$SIMT" "${GEN[@]}" --device cuda >gen-simt-$mode.out 2>gen-simt-$mode.err; then
        if [ "$(wc -c <gen-cpu-$mode.out)" -gt 6 ] && cmp -s gen-cpu-$mode.out gen-simt-$mode.out; then
          pass "generate --device cuda ($mode) prints the CPU's text"
        else
          fail "generate --device cuda ($mode): '$(cat gen-simt-$mode.out)' vs the CPU's '$(cat gen-cpu-$mode.out)'"
        fi
      else
        fail "generate ($mode) failed: $(tail -n 2 gen-simt-$mode.err gen-cpu-$mode.err)"
      fi
    done
  else
    fail "training on the corpus failed: $(tail -n 3 corpus-cpu.log corpus-simt.log)"
  fi
  # With the rotary embedding: the KV cache's keys rotated at their positions in the context.
  if "$LATTICE" "${TRAIN[@]}" --device cpu --position-embedding-type rope --save ckpt-rope >corpus-rope.log 2>&1; then
    GEN=(generate --load ckpt-rope --prompt "ab ab" --max-new-tokens 24 --temperature 0.8 --top-k 20 --seed 5)
    if "$LATTICE" "${GEN[@]}" --device cpu >gen-rope-cpu.out 2>gen-rope-cpu.err &&
       "$LATTICE" "${GEN[@]}" --device cpu --no-kv-cache >gen-rope-full.out 2>gen-rope-full.err &&
       timeout "$LIMIT" "$SIMT" "${GEN[@]}" --device cuda >gen-rope-simt.out 2>gen-rope-simt.err; then
      if [ "$(wc -c <gen-rope-cpu.out)" -gt 6 ] && cmp -s gen-rope-cpu.out gen-rope-simt.out &&
         cmp -s gen-rope-cpu.out gen-rope-full.out; then
        pass "rope: generate --device cuda (kv) prints the CPU's text, which the CPU's full recomputation prints too"
      else
        fail "rope generate: cuda '$(cat gen-rope-simt.out)', cpu '$(cat gen-rope-cpu.out)', cpu full '$(cat gen-rope-full.out)'"
      fi
    else
      fail "rope generate failed: $(tail -n 2 gen-rope-simt.err gen-rope-cpu.err gen-rope-full.err)"
    fi
  else
    fail "training with the rotary embedding failed: $(tail -n 3 corpus-rope.log)"
  fi
else
  fail "preprocess failed: $(tail -n 3 prep.log)"
fi

e2e_finish
