#!/usr/bin/python3
"""A random GPT-OSS model in HuggingFace's layout with MXFP4 experts (as OpenAI's checkpoints store them), of a
size to measure `lattice convert --from-hf`'s memory on: the values are random (not a trained model), the
tensors' names, shapes, dtypes and config.json those of HuggingFace's GptOssForCausalLM.

    /usr/bin/python3 bench/make_gpt_oss_mxfp4.py OUT_DIR [--layers 4] [--hidden 1024] [--experts 64]
        [--intermediate 1024] [--vocab 32000]

Needs numpy only. The experts' weights decode (in fp32) to layers x experts x 3 x hidden x intermediate floats.
"""
import argparse
import json
import os
import struct

import numpy as np


def write_safetensors(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, arr) in tensors.items():
        n = arr.nbytes
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, arr in tensors.values():
            f.write(np.ascontiguousarray(arr).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    C, I, E, V, L = a.hidden, a.intermediate, a.experts, a.vocab, a.layers
    heads, kv_heads, head_dim = 16, 4, 64
    rng = np.random.default_rng(0)

    def f32(*shape):
        return ("F32", (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def u8(*shape, lo=0, hi=256):
        return ("U8", rng.integers(lo, hi, size=shape, dtype=np.uint8))

    t = {"model.embed_tokens.weight": f32(V, C), "model.norm.weight": ("F32", np.ones(C, np.float32)),
         "lm_head.weight": f32(V, C)}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = ("F32", np.ones(C, np.float32))
        t[p + "post_attention_layernorm.weight"] = ("F32", np.ones(C, np.float32))
        for name, rows in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim),
                           ("v_proj", kv_heads * head_dim)):
            t[p + f"self_attn.{name}.weight"] = f32(rows, C)
            t[p + f"self_attn.{name}.bias"] = f32(rows)
        t[p + "self_attn.o_proj.weight"] = f32(C, heads * head_dim)
        t[p + "self_attn.o_proj.bias"] = f32(C)
        t[p + "self_attn.sinks"] = f32(heads)
        t[p + "mlp.router.weight"] = f32(E, C)
        t[p + "mlp.router.bias"] = f32(E)
        x = p + "mlp.experts."
        t[x + "gate_up_proj_blocks"] = u8(E, 2 * I, C // 32, 16)
        t[x + "gate_up_proj_scales"] = u8(E, 2 * I, C // 32, lo=118, hi=124)
        t[x + "gate_up_proj_bias"] = f32(E, 2 * I)
        t[x + "down_proj_blocks"] = u8(E, C, I // 32, 16)
        t[x + "down_proj_scales"] = u8(E, C, I // 32, lo=118, hi=124)
        t[x + "down_proj_bias"] = f32(E, C)
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), t)
    config = {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 2, "experts_per_token": 4, "head_dim": head_dim, "hidden_act": "silu", "hidden_size": C,
        "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": I,
        "layer_types": ["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(L)],
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": heads,
        "num_experts_per_tok": 4, "num_hidden_layers": L, "num_key_value_heads": kv_heads, "num_local_experts": E,
        "output_router_logits": False, "pad_token_id": 0,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"],
                                "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                         "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000.0, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.55.0", "use_cache": True,
        "vocab_size": V,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    main()
