# Shared by the checkpoint-resharding tests (sourced after lib.sh; call write_assembler in $TMP): a run
# resumed under another layout must continue an uninterrupted run ("straight", iterations
# 11..20, log straight.log, checkpoint straight/iter_0000020) to 1e-5 relative. Set
# BASELINE (words for messages), TRAIN and MPIRUN before calling resume.

losses() { grep -o "lm loss: [0-9.E+-]*" "$1" | awk '{print $3}'; }

# close_values N GOT WANT: both space-separated lists hold N numbers, each GOT within 1e-5 relative of WANT's.
close_values() {
  python3 -c "import sys; n=int(sys.argv[1]); g=[float(x) for x in sys.argv[2].split()]; w=[float(x) for x in sys.argv[3].split()]; sys.exit(0 if len(w)==n and len(g)==n and all(abs(a-b)<=1e-5*abs(b) for a,b in zip(g,w)) else 1)" "$@"
}

# Writes assemble.py into the current directory: tensors(DIR) reads a checkpoint's model
# tensors, assembled from their pieces, the vocabulary tensors cut to the real 64 rows.
write_assembler() {
cat > assemble.py <<'PY'
import json, struct
def files(d):
    out = {}
    def load(f):
        if f not in out:
            b = open(d + "/" + f, "rb").read()
            n = struct.unpack("<Q", b[:8])[0]
            out[f] = (json.loads(b[8:8 + n]), b, 8 + n)
        return out[f]
    return load
def tensors(d, prefix=""):
    idx = json.load(open(d + "/checkpoint.json"))["tensors"]; load = files(d); res = {}
    for name, e in idx.items():
        if not name.startswith(prefix) or (prefix == "" and name.startswith("optimizer.")): continue
        shape = e["shape"]; inner = 1
        for s in shape[1:]: inner *= s
        flat = [0.0] * (shape[0] * inner if shape else 1)
        for p in e["pieces"]:
            h, b, base = load(p["file"]); s0, e0 = h[p["key"]]["data_offsets"]
            vals = struct.unpack("<%df" % ((e0 - s0) // 4), b[base + s0:base + e0])
            off, ln = p["offsets"], p["lengths"]
            if len(shape) == 1:
                flat[off[0]:off[0] + ln[0]] = vals
            else:  # 2-D boxes
                for i in range(ln[0]):
                    r = (off[0] + i) * inner + off[1]
                    flat[r:r + ln[1]] = vals[i * ln[1]:(i + 1) * ln[1]]
        if name.endswith("word_embeddings.weight") or name.endswith("output_layer.weight"):
            flat = flat[:64 * inner]
        res[name] = flat
    return res
PY
}

compare() {  # NAME LOG DIR: iterations 11..20 of LOG and DIR/iter_0000020 against the straight run's
  local want got
  want=$(losses straight.log | tail -10 | tr '\n' ' ')
  got=$(losses "$2" | tr '\n' ' ')
  if close_values 10 "$got" "$want"; then
    pass "$1: losses equal the uninterrupted $BASELINE run's"
  else
    fail "$1: losses '$got', uninterrupted $BASELINE run '$want'"
  fi
  # Final parameters (which depend on the resumed Adam moments) against the straight run's.
  if python3 - "$3/iter_0000020" straight/iter_0000020 <<'PY'; then
import sys; sys.path.insert(0, ".")
from assemble import tensors
got, want = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
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

resume() {  # NAME CKPT NP FLAGS...: resumes a copy of CKPT to iteration 20
  local name=$1 src=$2 np=$3
  shift 3
  cp -r "$src" "r_$name"
  if "${MPIRUN[@]}" -np "$np" "$LATTICE" "${TRAIN[@]}" "$@" --load "r_$name" --save "r_$name" > "$name.log" 2>&1; then
    compare "$name" "$name.log" "r_$name"
  else
    fail "$name: resume failed: $(tail -2 "$name.log")"
  fi
}

