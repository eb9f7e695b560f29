#!/usr/bin/env bash
# --sft as a user runs it: Megatron's supervised fine-tuning on a JSONL file of conversations through a
# chat template (tests/fixtures/sft: byte tokens), the loss on the assistant's tokens only. One process
# learns (the loss falls, the validation split is evaluated); data parallelism (DP=2, with the distributed
# optimizer), tensor parallelism with sequence parallelism (TP=2) and pipeline parallelism (PP=2, with
# its micro-batches) give one process's losses to 1e-5 over 12 iterations with dropout, the emulated GPU
# (--device cuda) bit for bit; context parallelism (CP=2, each conversation padded to a multiple of 4)
# too, on conversations that need no padding. Several files: a weighted blend (each file split on its
# own) and the per-split paths. Bad input is one line naming the flag or file: --mock-data, no chat
# template, a bad line, a blend's odd word count, Megatron's prompt formats, --chat-template without --sft.
#   bash tests/e2e/test_sft.sh <path to lattice binary> <source dir>
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
export OMP_NUM_THREADS=1
FIX="$SRC/tests/fixtures/sft"
# 64 conversations of sums, split 60/4.
python3 -c '
import json, sys
with open("chat.jsonl", "w") as f:
    for i in range(64):
        a, b = i % 9 + 1, (i * 7) % 9 + 1
        m = [{"role": "system", "content": "Add."}, {"role": "user", "content": "%d+%d" % (a, b)},
             {"role": "assistant", "content": str(a + b)}]
        if i % 3 == 0:
            m += [{"role": "user", "content": "%d+%d" % (b, a)}, {"role": "assistant", "content": str(a + b)}]
        f.write(json.dumps({"messages": m}) + "\n")
'
SFT=(train --sft --chat-template "$FIX/chat.jinja" --tokenizer-type ByteTokenizer
     --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
     --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --log-interval 1 --seed 5
     --hidden-dropout 0.1 --attention-dropout 0.1 --split 60,4,0)

run one "$LATTICE" "${SFT[@]}" --data-path chat.jsonl --train-iters 40 --eval-interval 40 --eval-iters 1 --metrics-file one.jsonl &&
  python3 - one.jsonl <<'PY' && pass "one process: the loss falls over 40 iterations, the validation split evaluated" ||
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r["lm_loss"] for r in rows if "lm_loss" in r and r.get("split", "train") == "train"]
assert len(train) == 40, len(train)
first, last = sum(train[:5]) / 5, sum(train[-5:]) / 5
assert last < 0.6 * first, (first, last)
PY
  fail "one process: $(tail -n 3 one.err) $(tail -n 2 one.jsonl)"
grep -q "validation loss at iteration 40" one.out || fail "no validation loss: $(grep -i valid one.out | head -3)"
grep -q "SFT conversations of chat.jsonl, lines \[1, 60\] of 64" one.out ||
  fail "the summary does not name the training lines: $(grep 'SFT' one.out)"

# Every layout gives one process's losses.
run base "$LATTICE" "${SFT[@]}" --data-path chat.jsonl --train-iters 12 --eval-iters 0 --metrics-file base.jsonl || e2e_finish
for layout in "dp 2 --use-distributed-optimizer" "tp 2 --tensor-model-parallel-size 2 --sequence-parallel" \
              "pp 2 --pipeline-model-parallel-size 2"; do
  set -- $layout
  name=$1 np=$2
  shift 2
  if "${MPIRUN[@]}" -np "$np" "$LATTICE" "${SFT[@]}" --data-path chat.jsonl --train-iters 12 --eval-iters 0 --metrics-file "$name.jsonl" "$@" \
       >"$name.log" 2>&1; then
    expect_close_losses "--sft $name=2 ($*): one process's 12 losses" "$name.jsonl" base.jsonl 12
  else
    fail "--sft $name=2 run failed: $(tail -n 3 "$name.log")"
  fi
done

# The emulated GPU (the CPU's kernels over guarded device buffers): the same losses, bit for bit.
if LATTICE_EMULATE_CUDA=1 "$LATTICE" "${SFT[@]}" --data-path chat.jsonl --train-iters 12 --eval-iters 0 --device cuda \
     --metrics-file cuda.jsonl >cuda.log 2>&1; then
  [ "$(grep -o '"lm_loss":[^,}]*' cuda.jsonl)" = "$(grep -o '"lm_loss":[^,}]*' base.jsonl)" ] &&
    pass "--device cuda (emulated): one process's 12 losses bit for bit" ||
    fail "--device cuda (emulated): the losses differ from the CPU's"
else
  fail "--device cuda (emulated) run failed: $(tail -n 3 cuda.log)"
fi

# Context parallelism (CP=2) pads each conversation to a multiple of 4, as Megatron's does: on conversations
# whose tokens (with the end of document) already are a multiple of 4 it packs what one process packs, and
# gives its losses.
python3 - "$SRC/tests/e2e" "$FIX" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import chat_template_reference as ref
template = ref.environment().from_string(open(sys.argv[2] + "/chat.jinja").read())
special = json.load(open(sys.argv[2] + "/tokenizer_config.json"))
with open("chat4.jsonl", "w") as f:
    for i in range(64):
        line = []
        for k in range(2):  # two conversations a line
            a, b = (i + k) % 9 + 1, (i * 5 + k) % 9 + 1
            m = [{"role": "system", "content": "Add."}, {"role": "user", "content": "%d+%d" % (a, b)},
                 {"role": "assistant", "content": str(a + b)}]
            while (len(template.render(messages=m, add_generation_prompt=False, **special).encode()) + 1) % 4:
                m[-1]["content"] += "!"
            line += m
        f.write(json.dumps({"messages": line}) + "\n")
PY
run cp1 "$LATTICE" "${SFT[@]}" --data-path chat4.jsonl --train-iters 12 --eval-iters 0 --metrics-file cp1.jsonl &&
if "${MPIRUN[@]}" -np 2 "$LATTICE" "${SFT[@]}" --data-path chat4.jsonl --train-iters 12 --eval-iters 0 \
     --context-parallel-size 2 --metrics-file cp2.jsonl >cp2.log 2>&1; then
  expect_close_losses "--sft cp=2 on conversations of 4k tokens: one process's 12 losses" cp2.jsonl cp1.jsonl 12
else
  fail "--sft cp=2 run failed: $(tail -n 3 cp2.log)"
fi

# Several files: sums and products blended 3:1, each file split 60/4 on its own; then products for
# training and sums for validation (--train-data-path, --valid-data-path: each file whole).
python3 -c '
import json
with open("mul.jsonl", "w") as f:
    for i in range(32):
        a, b = i % 5 + 1, (i * 3) % 7 + 1
        f.write(json.dumps({"messages": [{"role": "user", "content": "%d*%d" % (a, b)},
                                         {"role": "assistant", "content": str(a * b)}]}) + "\n")
'
run blend "$LATTICE" "${SFT[@]}" --data-path 0.75 chat.jsonl 0.25 mul.jsonl --train-iters 30 --eval-interval 30 \
  --eval-iters 1 --metrics-file blend.jsonl &&
  grep -q "train: SFT conversations of chat.jsonl, lines \[1, 60\] of 64, [0-9]* samples, weight 0.75" blend.out &&
  grep -q "train: SFT conversations of mul.jsonl, lines \[1, 30\] of 32, [0-9]* samples, weight 0.25" blend.out &&
  grep -q "valid: SFT conversations of mul.jsonl, lines \[31, 32\] of 32" blend.out &&
  grep -q "validation loss at iteration 30" blend.out &&
  python3 - blend.jsonl <<'PY' && pass "a blend of two files: each split on its own, weighted, the loss falls" ||
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r["lm_loss"] for r in rows if "lm_loss" in r and r.get("split", "train") == "train"]
assert len(train) == 30 and sum(train[-5:]) < 0.7 * sum(train[:5]), train
PY
  fail "blend: $(grep -E 'SFT|error' blend.out blend.err | head -6)"
run per_split "$LATTICE" "${SFT[@]}" --train-data-path mul.jsonl --valid-data-path chat.jsonl --train-iters 4 \
  --eval-interval 4 --eval-iters 1 &&
  grep -q "train: SFT conversations of mul.jsonl, lines \[1, 32\] of 32" per_split.out &&
  grep -q "valid: SFT conversations of chat.jsonl, lines \[1, 64\] of 64" per_split.out &&
  grep -q "validation loss at iteration 4" per_split.out &&
  pass "--train-data-path and --valid-data-path: each file whole, for its split" ||
  fail "per-split paths: $(grep -E 'SFT|error' per_split.out per_split.err | head -6)"

printf '{"messages": [{"role": "user", "content": "x"}]}\n{"messages": []}\n' >bad.jsonl
expect_error "--sft --mock-data" "--sft|--mock-data" -- "$LATTICE" train --sft --mock-data --tokenizer-type ByteTokenizer
expect_error "--sft with a weight missing" "--data-path: expected one prefix or weight/prefix pairs" -- \
  "$LATTICE" "${SFT[@]}" --train-iters 1 --data-path 0.5 chat.jsonl mul.jsonl
expect_error "--sft without a chat template" "--sft|no chat template|--chat-template" -- \
  "$LATTICE" train --sft --data-path chat.jsonl --tokenizer-type ByteTokenizer --num-layers 1 --hidden-size 16 \
  --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 1 \
  --train-iters 1 --lr 1e-3
expect_error "a bad line" "bad.jsonl line 2|non-empty \"messages\"" -- \
  "$LATTICE" "${SFT[@]}" --train-iters 1 --data-path bad.jsonl
expect_error "Megatron's prompt formats" "--sft-tokenizer-prompt-format|chat template" -- \
  "$LATTICE" "${SFT[@]}" --data-path chat.jsonl --train-iters 1 --sft-tokenizer-prompt-format nemotron-h-aligned
expect_error "--chat-template without --sft" "--chat-template goes with --sft" -- \
  "$LATTICE" train --mock-data --chat-template "$FIX/chat.jinja" --num-layers 1 --hidden-size 16 --num-attention-heads 2 \
  --seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-3
e2e_finish
