#!/usr/bin/env bash
# lattice convert --from-megatron of a bf16 Megatron run with its Adam state (the non-distributed optimizer's: fp32
# main parameters, exp_avg, exp_avg_sq) on a 165M-parameter Llama-form model (8 layers, hidden 1024, vocabulary
# 32000, untied) saved by TP x PP ranks, in both formats (torch_dist, named; torch, numbered), and the distributed
# optimizer's in both (torch: distrib_optim.pt; torch_dist: dp_reshardable buckets): seconds and peak resident memory
# (/usr/bin/time), the median of ROUNDS, beside PyTorch reading the torch format's rank files (torch.load of each,
# every model tensor, main parameter and moment made whole, as a converter must; for the distributed optimizer
# torch.load of each rank's two files alone, a lower bound: its buffers are not taken apart). The
# checkpoints are written by tests/fixtures/make_megatron_fixture.py from a lattice-initialized model (PyTorch
# needed: scripts/install-deps.sh --bench).
#   LATTICE=build/lattice ROUNDS=3 TP=2 PP=2 bench/megatron_optim_convert.sh
set -euo pipefail
LATTICE=$(realpath "${LATTICE:-build/lattice}")
SRC=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
TP=${TP:-2}
PP=${PP:-2}
W=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
cd "$W"
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "PyTorch is needed (scripts/install-deps.sh --bench)"; exit 1; }

"$LATTICE" train --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 64 \
  --max-position-embeddings 64 --vocab-size 32000 --normalization RMSNorm --swiglu --disable-bias-linear \
  --position-embedding-type rope --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 1 \
  --lr 1e-4 --mock-data --eval-iters 0 --train-iters 1 --save ck >/dev/null 2>&1

# The lattice model's tensors with the metadata the fixture script reads (the model's flags).
/usr/bin/python3 - <<'EOF'
import json, struct
config = json.load(open("ck/iter_0000001/checkpoint.json"))["model_config"]
src = open("ck/iter_0000001/model.safetensors", "rb").read()
n = struct.unpack("<Q", src[:8])[0]
header = json.loads(src[8:8 + n])
header["__metadata__"] = {"num_layers": "8", "hidden_size": "1024", "num_attention_heads": "16",
                          "ffn_hidden_size": str(config["ffn_hidden_size"]), "max_position_embeddings": "64", "seq_length": "64",
                          "norm_epsilon": "1e-05", "padded_vocab_size": "32000", "vocab_size": "32000", "swiglu": "1",
                          "normalization": "RMSNorm", "position_embedding_type": "rope", "add_bias_linear": "0"}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open("reference.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + src[8 + n:])
EOF
for format in torch_dist torch; do
  /usr/bin/python3 "$SRC/tests/fixtures/make_megatron_fixture.py" reference.safetensors "mcore_$format" --tp "$TP" \
    --pp "$PP" --bf16 --format "$format" --optim nondist
done
for format in torch torch_dist; do  # the distributed optimizer's: distrib_optim.pt; torch_dist's buckets
  /usr/bin/python3 "$SRC/tests/fixtures/make_megatron_fixture.py" reference.safetensors "mcore_distopt_$format" \
    --tp "$TP" --pp "$PP" --bf16 --format "$format" --optim buffers
done

cat >megatron_stub.py <<'EOF'
import enum, sys, types
# The saved args hold a Megatron enum (megatron.core.transformer.enums.AttnBackend): importable here, as in Megatron.
enums = types.ModuleType("megatron.core.transformer.enums")
enums.AttnBackend = enum.Enum("AttnBackend", ["flash", "fused", "unfused", "local", "auto"])
for name in ["megatron", "megatron.core", "megatron.core.transformer"]:
    sys.modules[name] = types.ModuleType(name)
sys.modules["megatron.core.transformer.enums"] = enums
EOF
cat >torch_read.py <<'EOF'
import glob, torch
import megatron_stub
parts = {}
for f in sorted(glob.glob("mcore_torch/iter_*/mp_rank_*/model_optim_rng.pt")):
    sd = torch.load(f)
    params = [k for k, v in sd["model"].items() if torch.is_tensor(v) and not k.endswith("_extra_state")]
    for k in params:
        parts.setdefault(k, []).append(sd["model"][k])
    opt = sd["optimizer"]
    for st in opt["optimizer"]["state"].values():
        parts.setdefault(len(parts), []).extend([st["exp_avg"], st["exp_avg_sq"]])
    for group in opt["fp32_from_fp16_params"]:
        for p in group:
            parts.setdefault(len(parts), []).append(p.float())
whole = {k: (torch.cat(v, 0) if len(v) > 1 else v[0]) for k, v in parts.items()}
print(sum(t.numel() for t in whole.values()))
EOF

cat >torch_read_distopt.py <<'EOF'
import glob, torch
import megatron_stub
n = 0
for f in sorted(glob.glob("mcore_distopt_torch/iter_*/mp_rank_*/*.pt")):
    sd = torch.load(f)
    n += sum(t.numel() for t in (sd.get("model") or {}).values() if torch.is_tensor(t))
    for buffer in (v for k, v in sd.items() if isinstance(k, int)):
        for state in buffer.values():
            n += sum(state[k].numel() for k in ("param", "exp_avg", "exp_avg_sq"))
print(n)
EOF

measure() {  # NAME CMD...: appends "seconds peak_MB user_seconds system_seconds" to NAME.txt
  local name=$1
  shift
  sync  # the previous run's written pages flushed first: each run pays for its own writes only
  /usr/bin/time -f "%e %M %U %S" -o t.txt "$@" >"$name.log" 2>&1 || { echo "$name failed: $(tail -3 "$name.log")"; exit 1; }
  read -r s kb user sys <t.txt
  echo "$s $((kb / 1024)) $user $sys" >>"$name.txt"
}
median() { sort -n -k"$2" "$1.txt" | awk -v k="$2" '{ v[NR] = $k } END { print v[int((NR + 1) / 2)] }'; }

for _ in $(seq "$ROUNDS"); do
  rm -rf back_dist back_torch back_distopt back_distbuf
  measure dist "$LATTICE" convert --from-megatron mcore_torch_dist --save back_dist
  measure torch "$LATTICE" convert --from-megatron mcore_torch --save back_torch
  measure distopt "$LATTICE" convert --from-megatron mcore_distopt_torch --save back_distopt
  measure distbuf "$LATTICE" convert --from-megatron mcore_distopt_torch_dist --save back_distbuf
  measure pytorch /usr/bin/python3 torch_read.py
  measure pytorch_distopt /usr/bin/python3 torch_read_distopt.py
done
for b in back_torch back_distopt back_distbuf; do
  cmp -s back_dist/iter_0000100/optimizer.safetensors $b/iter_0000100/optimizer.safetensors ||
    { echo "the formats converted to different optimizer states ($b)"; exit 1; }
done
echo "| command (bf16, TP $TP, PP $PP, with Adam's state; median of $ROUNDS) | seconds | peak RSS MB | user s | system s |"
echo "|---|---:|---:|---:|---:|"
echo "| lattice convert --from-megatron (torch_dist: $(du -sm mcore_torch_dist | cut -f1) MB) | $(median dist 1) | $(median dist 2) | $(median dist 3) | $(median dist 4) |"
echo "| lattice convert --from-megatron (torch: $(du -sm mcore_torch | cut -f1) MB) | $(median torch 1) | $(median torch 2) | $(median torch 3) | $(median torch 4) |"
echo "| lattice convert --from-megatron (torch, distributed optimizer: $(du -sm mcore_distopt_torch | cut -f1) MB) | $(median distopt 1) | $(median distopt 2) | $(median distopt 3) | $(median distopt 4) |"
echo "| lattice convert --from-megatron (torch_dist, distributed optimizer: $(du -sm mcore_distopt_torch_dist | cut -f1) MB) | $(median distbuf 1) | $(median distbuf 2) | $(median distbuf 3) | $(median distbuf 4) |"
echo "| python3: torch.load of every torch rank file, tensors made whole | $(median pytorch 1) | $(median pytorch 2) | $(median pytorch 3) | $(median pytorch 4) |"
echo "| python3: torch.load of every distributed-optimizer rank file (buffers not taken apart) | $(median pytorch_distopt 1) | $(median pytorch_distopt 2) | $(median pytorch_distopt 3) | $(median pytorch_distopt 4) |"
echo "(the converted checkpoint: $(du -sm back_dist | cut -f1) MB)"
