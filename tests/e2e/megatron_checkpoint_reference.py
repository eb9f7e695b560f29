#!/usr/bin/python3
"""Checks a Megatron-LM checkpoint (--ckpt-format torch) that `lattice convert --to-megatron` wrote, with
Python's own zipfile and pickle modules (no PyTorch, nothing from lattice):

  megatron_checkpoint_reference.py MCORE_DIR MODEL.safetensors TP PP

- MCORE_DIR/latest_checkpointed_iteration.txt says "release"; each rank's release/mp_rank_TT[_PPP]/
  model_optim_rng.pt is a zip archive whose records pass their CRC check, data.pkl first;
- data.pkl unpickles as torch.load rebuilds it (torch._utils._rebuild_tensor_v2 on persistent ids
  ('storage', torch.<Type>Storage, key, 'cpu', numel), each storage record numel x element size bytes,
  contiguous strides) into {'args': argparse.Namespace, 'checkpoint_version': 3.0, 'iteration', 'model'};
- the args name the layout (tensor_model_parallel_size TP, pipeline_model_parallel_size PP) and the model;
- each rank's tensors, reassembled as Megatron-Core splits them (its own implementation of the rules:
  column-parallel rows, SwiGLU's gate and up blocks, row-parallel columns, everything else whole and equal
  on every rank; a stage's layers numbered from 0; Transformer Engine's fused norm names), equal the lattice
  checkpoint's MODEL.safetensors tensor for tensor, bit for bit (the vocabulary's padding rows zero), and no
  tensor is left over; every linear layer has an _extra_state (a Transformer Engine module's a pickled None,
  Megatron-Core's own None), and the last stage's output layer.

  megatron_checkpoint_reference.py --tensors MODEL.safetensors

prints each tensor's name, shape and bytes' SHA-256 (to compare two checkpoints' weights).
"""
import argparse
import array
import hashlib
import io
import json
import os
import pickle
import struct
import sys
import zipfile

ELEMENT_BYTES = {"FloatStorage": 4, "BFloat16Storage": 2, "HalfStorage": 2, "ByteStorage": 1}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F32", (name, h["dtype"])
        b, e = h["data_offsets"]
        out[name] = (tuple(h["shape"]), data[8 + n + b:8 + n + e])
    return out


class Unpickler(pickle.Unpickler):
    def __init__(self, f, records):
        super().__init__(f)
        self.records = records

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild_tensor
        if (module, name) == ("argparse", "Namespace"):
            return argparse.Namespace
        if (module, name) == ("collections", "OrderedDict"):
            import collections
            return collections.OrderedDict
        if module == "torch" and name in ELEMENT_BYTES:
            return name
        raise pickle.UnpicklingError("unexpected global %s.%s" % (module, name))

    def persistent_load(self, pid):
        typename, storage_type, key, location, numel = pid
        assert typename == "storage" and location == "cpu", pid
        data = self.records["data/" + key]
        assert len(data) == numel * ELEMENT_BYTES[storage_type], (key, len(data), numel)
        return storage_type, data, numel

    @staticmethod
    def rebuild_tensor(storage, offset, size, stride, requires_grad, hooks, *rest):
        storage_type, data, numel = storage
        expect, n = [], 1
        for d in reversed(size):
            expect.insert(0, n)
            n *= d
        assert tuple(stride) == tuple(expect) and offset == 0 and n == numel, (size, stride, offset)
        return {"type": storage_type, "shape": tuple(size), "bytes": data}


def load(path):
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None, path + ": a record fails its CRC"
        names = z.namelist()
        assert names[0].endswith("/data.pkl"), names[0]
        prefix = names[0][:-len("data.pkl")]
        records = {n[len(prefix):]: z.read(n) for n in names}
    return Unpickler(io.BytesIO(records["data.pkl"]), records).load()


TE_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias",
}


def floats(b):
    a = array.array("f")
    a.frombytes(b)
    return a


def main():
    if sys.argv[1] == "--tensors":
        for name, (shape, data) in sorted(read_safetensors(sys.argv[2]).items()):
            print(name, shape, hashlib.sha256(data).hexdigest())
        return
    mcore, model_path, tp, pp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with open(os.path.join(mcore, "latest_checkpointed_iteration.txt")) as f:
        assert f.read().strip() == "release"
    ranks = {}
    for t in range(tp):
        for p in range(pp):
            name = "mp_rank_%02d" % t + ("_%03d" % p if pp > 1 else "")
            ranks[t, p] = load(os.path.join(mcore, "release", name, "model_optim_rng.pt"))
    args = ranks[0, 0]["args"]
    assert isinstance(args, argparse.Namespace)
    assert args.tensor_model_parallel_size == tp and args.pipeline_model_parallel_size == pp, vars(args)
    te = args.transformer_impl == "transformer_engine"
    L = args.num_layers
    for s in ranks.values():
        assert s["checkpoint_version"] == 3.0 and s["iteration"] == 0
        assert vars(s["args"]) == vars(args)
    model = read_safetensors(model_path)
    left = {k: {n for n in s["model"] if not n.endswith("._extra_state")} for k, s in ranks.items()}
    for name, (shape, data) in model.items():
        p, local = 0, name
        if name.startswith("decoder.layers."):
            l, rest = name[len("decoder.layers."):].split(".", 1)
            l = int(l)
            p, j = l // (L // pp), l % (L // pp)
            local = "decoder.layers.%d.%s" % (j, TE_NAMES.get(rest, rest) if te else rest)
        elif name.startswith("decoder.final_layernorm") or name == "output_layer.weight":
            p = pp - 1
        parts = []
        for t in range(tp):
            tensor = ranks[t, p]["model"][local]
            assert tensor["type"] == "FloatStorage", (local, tensor["type"])
            parts.append((tensor["shape"], floats(tensor["bytes"])))
            left[t, p].discard(local)
        want = floats(data)
        rows = shape[0]
        cols = len(want) // rows if rows else 0
        column = local.endswith(("linear_qkv.weight", "linear_fc1.weight")) or local in (
            "embedding.word_embeddings.weight", "output_layer.weight")
        row = local.endswith(("linear_proj.weight", "linear_fc2.weight"))
        if column:
            blocks = 2 if local.endswith("linear_fc1.weight") and args.swiglu else 1
            got = []
            for b in range(blocks):  # block b of every rank, in rank order
                for s, vals in parts:
                    n = len(vals) // blocks
                    got.extend(vals[b * n:(b + 1) * n])
            vocab = local in ("embedding.word_embeddings.weight", "output_layer.weight")
            if vocab:  # the target layout's padding rows are zero
                assert all(v == 0 for v in got[len(want):]), local
                got = got[:len(want)]
            assert array.array("f", got) == want, local
        elif row:
            got = array.array("f")
            per = cols // tp
            for r in range(rows):
                for s, vals in parts:
                    got.extend(vals[r * per:(r + 1) * per])
            assert got == want, local
        else:
            for s, vals in parts:
                assert vals == want, local
    for k, names in left.items():
        names.discard("output_layer.weight") if not args.untie_embeddings_and_output_weights else None
        assert not names, (k, sorted(names))
    # The extra state: a Transformer Engine module's pickled None (a uint8 tensor), Megatron-Core's own linear
    # layers' None; every linear layer has one, and the last stage's output layer.
    for (t, p), s in ranks.items():
        extra = {n for n in s["model"] if n.endswith("._extra_state")}
        for n in extra:
            v = s["model"][n]
            assert v is None if not te or n == "output_layer._extra_state" else pickle.loads(v["bytes"]) is None, n
        for n in s["model"]:
            if n.endswith(("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")):
                assert n[:-len("weight")] + "_extra_state" in extra, n
        assert (p == pp - 1) == ("output_layer._extra_state" in extra), (t, p)
    print("ok: %d rank files, %d tensors" % (len(ranks), len(model)))


if __name__ == "__main__":
    main()
