#!/usr/bin/env bash
# A damaged checkpoint (flipped byte in each file, truncated file, missing file, bad tracker)
# stops `lattice train --load` with one line naming the file and a non-zero exit, and
# nothing on disk changes: not the checkpoint, not the --save directory, not the metrics file.
#   bash tests/e2e/test_checkpoint_corrupt.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1
# Debian's interpreter: a python3 shim first on PATH can take a second to start.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

BASE=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 4
      --log-interval 1 --seed 1234 --peak-tflops 1 --num-threads 1 --mock-data --vocab-size 64)

if ! "$LATTICE" train "${BASE[@]}" --exit-interval 2 --save ckpt --metrics-file metrics.jsonl >save.out 2>save.err; then
  fail "could not save the checkpoint to corrupt"
  sed 's/^/    /' save.err >&2
  e2e_finish
fi
cp -a ckpt pristine
IT=ckpt/iter_0000002

# snapshot: a digest of every file under ckpt and of the metrics file, names included.
snapshot() { (find ckpt -type f -print0 | sort -z | xargs -0 sha256sum; sha256sum metrics.jsonl) | sha256sum; }

# corrupt NAME FILE PATTERNS ACTION...: damages the checkpoint with ACTION, expects a resume
# (saving into the same directory, appending to the same metrics file) to fail naming FILE,
# checks nothing changed, then restores the pristine checkpoint.
corrupt() {
  local name=$1 file=$2 patterns=$3
  shift 3
  "$@"
  local before
  before=$(snapshot)
  expect_error "$name" "$file|$patterns" -- \
    "$LATTICE" train "${BASE[@]}" --load ckpt --save ckpt --save-interval 1 --metrics-file metrics.jsonl
  [ "$(snapshot)" = "$before" ] || fail "$name: the failed resume changed files on disk"
  rm -rf ckpt && cp -a pristine ckpt
}

# flip FILE OFFSET: xor one byte of FILE with 0x20 (OFFSET from the start; negative from the end).
flip() {
  "$PY" - "$1" "$2" <<'PY'
import sys
path, off = sys.argv[1], int(sys.argv[2])
data = bytearray(open(path, "rb").read())
data[off] ^= 0x20
open(path, "wb").write(data)
PY
}
truncate_by() { local n; n=$(stat -c %s "$1"); truncate -s $((n - $2)) "$1"; }
set_tracker() { printf '%s' "$1" >ckpt/latest_checkpointed_iteration.txt; }

corrupt "flipped byte in the model data" $IT/model.safetensors "corrupt" flip $IT/model.safetensors -100
corrupt "flipped byte in the model header" $IT/model.safetensors "corrupt" flip $IT/model.safetensors 12
corrupt "flipped byte in the optimizer state" $IT/optimizer.safetensors "corrupt" flip $IT/optimizer.safetensors -5
corrupt "truncated model file" $IT/model.safetensors "truncated" truncate_by $IT/model.safetensors 64
corrupt "truncated optimizer file" $IT/optimizer.safetensors "truncated" truncate_by $IT/optimizer.safetensors 1
corrupt "missing model file" $IT/model.safetensors "missing" rm $IT/model.safetensors
corrupt "missing optimizer file" $IT/optimizer.safetensors "missing" rm $IT/optimizer.safetensors
corrupt "missing checkpoint.json" $IT/checkpoint.json "missing" rm $IT/checkpoint.json
corrupt "truncated checkpoint.json" $IT/checkpoint.json "corrupt" truncate_by $IT/checkpoint.json 40
# A digit of the iteration count changed: still valid JSON, caught by the index checksum.
corrupt "edited checkpoint.json" $IT/checkpoint.json "CRC-32 mismatch" \
  sed -i 's/"consumed_train_samples": 8/"consumed_train_samples": 9/' $IT/checkpoint.json
corrupt "tracker names a missing iteration" ckpt/iter_0000003/checkpoint.json "missing" set_tracker 3
corrupt "garbage tracker" ckpt/latest_checkpointed_iteration.txt "not an iteration number" set_tracker 'x2'
corrupt "empty tracker" ckpt/latest_checkpointed_iteration.txt "not an iteration number" set_tracker ''

# The pristine copy still resumes (the test itself is not what fails).
if "$LATTICE" train "${BASE[@]}" --load ckpt --metrics-file metrics.jsonl >ok.out 2>ok.err &&
   grep -q ' iteration        3/' ok.out; then
  pass "the undamaged checkpoint resumes"
else
  fail "the undamaged checkpoint does not resume"
  sed 's/^/    /' ok.err >&2
fi

# generate reads the same checks.
flip $IT/model.safetensors -100
expect_error "generate on a damaged checkpoint" "$IT/model.safetensors|corrupt" -- \
  "$LATTICE" generate --load ckpt --prompt ab --max-new-tokens 2

e2e_finish
