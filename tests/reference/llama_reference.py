#!/usr/bin/python3
"""Independent reference for the decoder forward pass (Llama / Qwen2 / Qwen3 / Mistral).

Written directly on torch from the Hugging Face config.json and *.safetensors (parsed here
with json + numpy, no safetensors or transformers package), so the C++ engine is checked
against code that shares nothing with it.

stdin:  {"model_dir": str, "batch": [[ids...], ...], "dtype": "fp32"|"bf16",
         "greedy_tokens": int (optional; 0 = none)}
        Sequences in a batch may differ in length: each is run on its own (no padding
        tricks), which is exactly what a padded batch must reproduce.
stdout: {"logits": [[[float]*vocab]*len]*batch, "greedy": [[ids]]}
Or stdin {"rope_tables": config, "positions": P, "rows": [...]}: stdout {"cos": [[...]], "sin": [[...]]},
the fp32 RoPE tables' given rows.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "BF16":
            u16 = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(info["shape"]))
    return out


def load_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(model_dir, f)))
    # Tied embeddings may be stored once under either name.
    if "model.embed_tokens.weight" not in w and "lm_head.weight" in w:
        w["model.embed_tokens.weight"] = w["lm_head.weight"]
    return w


def rope_inv_freq(cfg, head_dim):
    # fp32 throughout, as transformers' rotary embedding initialisers compute it.
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rs = cfg.get("rope_scaling") or None
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "linear":
            inv = inv / rs["factor"]
        elif kind == "llama3":
            factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            lo_wl, hi_wl = old / lo, old / hi
            wl = 2 * math.pi / inv
            scaled = torch.where(wl > lo_wl, inv / factor, inv)
            smooth = (old / wl - lo) / (hi - lo)
            mid = (1 - smooth) * scaled / factor + smooth * scaled
            is_mid = (wl >= hi_wl) & (wl <= lo_wl)
            inv = torch.where(is_mid, mid, scaled)
        else:
            raise SystemExit(f"reference: unsupported rope_scaling {kind}")
    return inv


def layer_windows(cfg):
    """Each layer's sliding window (None: full attention), by transformers' config rules:
    Mistral windows every layer (its config class defaults sliding_window to 4096 when the key
    is absent); Qwen2/Qwen3 only with use_sliding_window, the layers layer_types names
    "sliding_attention", or without layer_types those from max_window_layers (default 28) on."""
    n = cfg["num_hidden_layers"]
    kind = cfg.get("model_type")
    window = cfg["sliding_window"] if "sliding_window" in cfg else 4096
    if kind == "mistral":
        return [window] * n
    if kind in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window", False) or window is None:
            return [None] * n
        types = cfg.get("layer_types")
        if types is None:
            first = cfg.get("max_window_layers", 28)
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        return [window if t == "sliding_attention" else None for t in types]
    return [None] * n


def causal_mask(L, window):
    mask = torch.full((L, L), float("-inf")).triu(1)
    if window is not None:  # key j visible from query i only when i - j < window
        mask = mask + torch.full((L, L), float("-inf")).tril(-window)
    return mask


def rope_tables(inv, positions):
    """cos/sin [positions, head_dim] in fp32: position ids as floats times inv_freq, as
    transformers' rotary forward does (its outer product is one fp32 multiply per entry)."""
    ang = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


def rms_norm(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y.to(x.dtype)) * w


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def forward(cfg, w, ids, dtype):
    x = hidden_states(cfg, w, ids, dtype)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"]).to(dtype)
    return (x @ head.T).float()


def hidden_states(cfg, w, ids, dtype):
    """The final-norm hidden state of every position (the input of the LM head)."""
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    L = len(ids)
    t = torch.tensor(ids, dtype=torch.long)
    x = w["model.embed_tokens.weight"].to(dtype)[t]
    inv = rope_inv_freq(cfg, hd)
    cos, sin = rope_tables(inv, L)
    cos, sin = cos.to(dtype), sin.to(dtype)
    windows = layer_windows(cfg)
    for i in range(cfg["num_hidden_layers"]):
        mask = causal_mask(L, windows[i])
        p = f"model.layers.{i}."
        g = lambda n: w[p + n].to(dtype)
        h = rms_norm(x, g("input_layernorm.weight"), eps)
        q = h @ g("self_attn.q_proj.weight").T
        k = h @ g("self_attn.k_proj.weight").T
        v = h @ g("self_attn.v_proj.weight").T
        if p + "self_attn.q_proj.bias" in w:
            q = q + g("self_attn.q_proj.bias")
            k = k + g("self_attn.k_proj.bias")
            v = v + g("self_attn.v_proj.bias")
        q = q.view(L, nh, hd).transpose(0, 1)
        k = k.view(L, nkv, hd).transpose(0, 1)
        v = v.view(L, nkv, hd).transpose(0, 1)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3
            q = rms_norm(q, g("self_attn.q_norm.weight"), eps)
            k = rms_norm(k, g("self_attn.k_norm.weight"), eps)
        q = rotate(q, cos, sin)
        k = rotate(k, cos, sin)
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=0)
        v = v.repeat_interleave(rep, dim=0)
        att = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(hd) + mask
        att = torch.softmax(att, dim=-1).to(dtype)
        o = (att @ v).transpose(0, 1).reshape(L, nh * hd)
        x = x + o @ g("self_attn.o_proj.weight").T
        h = rms_norm(x, g("post_attention_layernorm.weight"), eps)
        gate = h @ g("mlp.gate_proj.weight").T
        up = h @ g("mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * up) @ g("mlp.down_proj.weight").T
    return rms_norm(x, w["model.norm.weight"].to(dtype), eps)


def main():
    req = json.load(sys.stdin)
    if "rope_tables" in req:  # {"rope_tables": config, "positions": P, "rows": [ids...]}
        cfg = req["rope_tables"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cos, sin = rope_tables(rope_inv_freq(cfg, hd), req["positions"])
        rows = req["rows"]
        sys.stdout.write(json.dumps({"cos": cos[rows].tolist(), "sin": sin[rows].tolist()}))
        return
    cfg = json.load(open(os.path.join(req["model_dir"], "config.json")))
    w = load_weights(req["model_dir"])
    dtype = torch.bfloat16 if req.get("dtype") == "bf16" else torch.float32
    torch.set_grad_enabled(False)
    out = {"logits": [], "greedy": []}
    for ids in req["batch"]:
        out["logits"].append(forward(cfg, w, ids, dtype).tolist())
        seq = list(ids)
        for _ in range(req.get("greedy_tokens", 0)):
            seq.append(int(forward(cfg, w, seq, dtype)[-1].argmax()))
        out["greedy"].append(seq[len(ids):])
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
