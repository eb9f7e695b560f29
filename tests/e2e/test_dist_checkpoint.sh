#!/usr/bin/env bash
# Checkpoints under data parallelism: a run saved at DP=4 with the distributed optimizer
# (sharded Adam state) resumes at DP=2 and at DP=1, and the next losses equal an
# uninterrupted single-process run's (to 1e-5 relative: only reduction order differs).
# With --overlap-param-gather, where the last step's parameter all-gather is still in flight
# when the iteration ends, the evaluations and the checkpoints are those of the run without.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
cd "$TMP"

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
       --global-batch-size 8 --mock-data --vocab-size 64 --log-interval 1 --eval-iters 0 --lr 1e-3
       --hidden-dropout 0.1 --attention-dropout 0.1 --seed 7)

losses() { grep -o "lm loss: [0-9.E+-]*" "$1" | awk '{print $3}'; }

OMP_NUM_THREADS=1 "$LATTICE" "${TRAIN[@]}" --train-iters 6 --save straight > straight.log 2>&1 || fail "straight run failed: $(tail -2 straight.log)"
"${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" --train-iters 6 --exit-interval 3 --use-distributed-optimizer \
  --save ckpt > dp4.log 2>&1 || fail "DP=4 run failed: $(tail -2 dp4.log)"
[[ -f ckpt/latest_checkpointed_iteration.txt ]] || fail "DP=4 run wrote no checkpoint"

compare() {  # NAME LOG: iterations 4..6 of LOG against the straight run's
  local want got
  want=$(losses straight.log | tail -3 | tr '\n' ' ')
  got=$(losses "$2" | tr '\n' ' ')
  if python3 -c "import sys; w=[float(x) for x in sys.argv[1].split()]; g=[float(x) for x in sys.argv[2].split()]; sys.exit(0 if len(w)==3 and len(g)==3 and all(abs(a-b)<=1e-5*abs(b) for a,b in zip(g,w)) else 1)" "$want" "$got"; then
    pass "$1: losses $got equal the uninterrupted run's"
  else
    fail "$1: losses '$got', uninterrupted run '$want'"
  fi
  # Final parameters (which depend on the resumed Adam moments) against the straight run's.
  if python3 - "$3/iter_0000006/model.safetensors" straight/iter_0000006/model.safetensors <<'PY'; then
import json, struct, sys
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); base = 8 + n; out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[base + s:base + e])
    return out
got, want = read(sys.argv[1]), read(sys.argv[2])
scale = max(abs(x) for t in want.values() for x in t)
err = max(abs(a - b) for k in want for a, b in zip(got[k], want[k]))
print("max parameter error %.3g (scale %.3g)" % (err, scale))
sys.exit(0 if err <= 1e-5 * scale else 1)
PY
    pass "$1: final parameters equal the uninterrupted run's"
  else
    fail "$1: final parameters differ from the uninterrupted run's"
  fi
}

for np in 2 1; do
  cp -r ckpt "ckpt$np"
  "${MPIRUN[@]}" -np $np "$LATTICE" "${TRAIN[@]}" --train-iters 6 --use-distributed-optimizer --load "ckpt$np" --save "ckpt$np" \
    > "resume$np.log" 2>&1 || fail "resume at DP=$np failed: $(tail -2 "resume$np.log")"
  compare "DP=4 -> DP=$np" "resume$np.log" "ckpt$np"
done
# --num-distributed-optimizer-instances 2: the DP=4 checkpoint resumes with two instances of 2 ranks
# (each shards the optimizer over itself, the shards summed across the instances) as an uninterrupted
# single process; the layouts that cannot hold it are one-line errors.
cp -r ckpt ckpt_inst
"${MPIRUN[@]}" -np 4 "$LATTICE" "${TRAIN[@]}" --train-iters 6 --use-distributed-optimizer \
  --num-distributed-optimizer-instances 2 --load ckpt_inst --save ckpt_inst > resume_inst.log 2>&1 ||
  fail "resume with 2 optimizer instances failed: $(tail -2 resume_inst.log)"
compare "DP=4 -> DP=4 with 2 distributed-optimizer instances" resume_inst.log ckpt_inst
expect_error "optimizer instances without the distributed optimizer" \
  "--num-distributed-optimizer-instances 2 needs --use-distributed-optimizer" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --num-distributed-optimizer-instances 2
expect_error "optimizer instances that do not divide the data-parallel size" \
  "--num-distributed-optimizer-instances 2 does not divide the data-parallel size 1" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 2 --use-distributed-optimizer --num-distributed-optimizer-instances 2
# --overlap-param-gather: the evaluations during training and the checkpoints read the
# parameters the step's all-gather is still writing; they must wait for it (the run's next
# forward would), and so equal the run without the overlap, bit for bit (the same ranks
# reduce in the same order).
GATHER=(train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
        --global-batch-size 8 --mock-data --vocab-size 64 --log-interval 1 --lr 1e-3 --hidden-dropout 0.1
        --attention-dropout 0.1 --seed 7 --train-iters 4 --eval-interval 2 --eval-iters 1
        --use-distributed-optimizer --save-interval 2)
vlosses() { grep -o 'lm loss value: [0-9.E+-]*' "$1" | awk '{print $4}' | tr '\n' ' '; }
"${MPIRUN[@]}" -np 2 "$LATTICE" "${GATHER[@]}" --save gather-off > gather-off.log 2>&1 ||
  fail "DP=2 run failed: $(tail -2 gather-off.log)"
"${MPIRUN[@]}" -np 2 "$LATTICE" "${GATHER[@]}" --save gather-on --overlap-param-gather > gather-on.log 2>&1 ||
  fail "DP=2 run with --overlap-param-gather failed: $(tail -2 gather-on.log)"
off=$(vlosses gather-off.log)
on=$(vlosses gather-on.log)
if [ "$(wc -w <<<"$off")" -eq 4 ] && [ "$on" = "$off" ]; then
  pass "--overlap-param-gather: the validation and test losses are the run's without ($on)"
else
  fail "--overlap-param-gather: validation and test losses '$on', without the overlap '$off'"
fi
for it in 2 4; do
  f=iter_000000$it/model.safetensors
  if [ -f "gather-off/$f" ] && cmp -s "gather-off/$f" "gather-on/$f"; then
    pass "--overlap-param-gather: the checkpoint of iteration $it has the parameters of the run without"
  else
    fail "--overlap-param-gather: gather-on/$f differs from gather-off/$f"
  fi
done

# --ddp-num-buckets 3: buckets of (the rank's parameters) // 3 elements (3 reduce-scatters per iteration,
# where the default makes one bucket), the same buckets (and so the same losses, bit for bit) as
# --ddp-bucket-size with that count.
if run buckets_n "${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 3 --use-distributed-optimizer \
     --ddp-num-buckets 3 --log-comm; then
  grep -q 'reduce_scatter [0-9.]* MB in [0-9.]* ms (3 calls)' buckets_n.out &&
    pass "--ddp-num-buckets 3: 3 buckets reduce-scattered per iteration" ||
    fail "--ddp-num-buckets 3: $(grep -m 1 'communication per iteration' buckets_n.out)"
  params=$(grep -o '> lattice: [0-9]* parameters' buckets_n.out | head -n 1 | awk '{print $3}')
  if [ -n "$params" ] && run buckets_size "${MPIRUN[@]}" -np 2 "$LATTICE" "${TRAIN[@]}" --train-iters 3 \
       --use-distributed-optimizer --ddp-bucket-size $((params / 3)); then
    [ -n "$(losses buckets_n.out)" ] && [ "$(losses buckets_n.out)" = "$(losses buckets_size.out)" ] &&
      pass "--ddp-num-buckets 3 is --ddp-bucket-size $((params / 3)) ($params parameters)" ||
      fail "--ddp-num-buckets 3: $(losses buckets_n.out | tr '\n' ' ') against $(losses buckets_size.out | tr '\n' ' ')"
  fi
fi
expect_error "--ddp-num-buckets with --ddp-bucket-size" "--ddp-num-buckets|--ddp-bucket-size" -- \
  "$LATTICE" "${TRAIN[@]}" --train-iters 1 --ddp-num-buckets 2 --ddp-bucket-size 100

e2e_finish
