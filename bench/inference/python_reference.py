#!/usr/bin/python3
"""The Python baseline of bench_inference: a Llama-family decoder written the way a user of
the Python stack writes it with torch eager (the Hugging Face eager layout: separate q/k/v/o
and gate/up/down projections through F.linear, RMSNorm statistics in fp32, rotate-half RoPE,
attention matmuls in the compute dtype with the softmax in fp32), plus a batched greedy
generate loop over a preallocated KV cache (one [batch, kv_heads, max_len, head_dim] K and V
per layer, written in place: the "static cache" a careful user writes, cheaper than growing
it with torch.cat). Grouped-query heads share their K/V through a reshape, without copying K/V
per query head.

It shares no code with the C++ engine: the weights are read from the same model directory's
*.safetensors with json + numpy (no safetensors / transformers package).

Usage: python_reference.py SPEC_JSON_FILE (bench/common/reference_common.py), where the file holds
  {"model_dir": str, "dtype": "fp32"|"bf16", "threads": int,
   "prefill": [{"name": str, "batch": int, "tokens": int, "reps": int}, ...],
   "decode": [{"batch": int, "prompt": int, "warmup": int, "steps": int, "reps": int}, ...],
   "seed": int}
Prints one JSON object to stdout (progress goes to stderr):
  {"torch": str, "threads": int, "interop_threads": int, "load_s": float,
   "weight_bytes": int, "rss_after_load_kib": int, "peak_rss_kib": int,
   "prefill": [{"name", "batch", "tokens", "seconds", "tok_s"}],
   "decode": [{"batch", "steps", "seconds", "tok_s", "kv_bytes"}]}
Prefill runs a [batch, tokens] padded-free batch (all prompts the same length) in one call
and keeps only the last position's logits. Decode starts with `prompt` positions of every
sequence already in the cache (random K/V, as the C++ side does), runs `warmup` untimed steps,
then times `steps` steps of forward + greedy argmax, `reps` times over the same positions (the
best pass counts, as on the C++ side).
"""
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from reference_common import ModelShape, emit, log, read_spec, rss_kib  # noqa: E402

NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_tensors(path):
    """name -> float32 numpy array, from one .safetensors file."""
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = np.frombuffer(blob, dtype=np.uint8, count=hi - lo, offset=lo)
        if info["dtype"] == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw.view(NUMPY_DTYPES[info["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def load_state(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for name in files:
        state.update(read_tensors(os.path.join(model_dir, name)))
    return state


class Llama(ModelShape):
    def __init__(self, model_dir, dtype):
        super().__init__(model_dir, dtype)
        cfg = self.cfg
        if cfg.get("rope_scaling"):
            raise SystemExit("python_reference: rope_scaling is not implemented here")

        state = load_state(model_dir)
        t = lambda name: torch.from_numpy(state.pop(name)).to(dtype).contiguous()
        if "model.embed_tokens.weight" in state:
            self.embed = t("model.embed_tokens.weight")
        else:  # tied embeddings stored once, as the head
            self.embed = t("lm_head.weight")
        self.head = t("lm_head.weight") if "lm_head.weight" in state else self.embed
        self.norm = t("model.norm.weight")
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            opt = lambda n: t(p + n) if (p + n) in state else None
            self.layers.append({
                "in_norm": t(p + "input_layernorm.weight"),
                "q": t(p + "self_attn.q_proj.weight"), "q_b": opt("self_attn.q_proj.bias"),
                "k": t(p + "self_attn.k_proj.weight"), "k_b": opt("self_attn.k_proj.bias"),
                "v": t(p + "self_attn.v_proj.weight"), "v_b": opt("self_attn.v_proj.bias"),
                "o": t(p + "self_attn.o_proj.weight"),
                "post_norm": t(p + "post_attention_layernorm.weight"),
                "gate": t(p + "mlp.gate_proj.weight"),
                "up": t(p + "mlp.up_proj.weight"),
                "down": t(p + "mlp.down_proj.weight"),
            })
        seen, self.weight_bytes = set(), 0
        for w in [self.embed, self.head, self.norm] + [x for l in self.layers for x in l.values()]:
            if w is not None and id(w) not in seen:
                seen.add(id(w))
                self.weight_bytes += w.numel() * w.element_size()

        theta = cfg.get("rope_theta", 10000.0)
        inv = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        ang = torch.arange(self.max_pos, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        self.cos = ang.cos().float().to(dtype)
        self.sin = ang.sin().float().to(dtype)

    def rms_norm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(self.dtype) * w

    @staticmethod
    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def new_cache(self, batch, max_len):
        shape = (batch, self.n_kv, max_len, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                for _ in range(self.n_layers)]

    def forward(self, ids, start, cache):
        """ids [B, T] at positions start..start+T-1 of every row; writes K/V into `cache`;
        returns the fp32 logits of the last position, [B, vocab]."""
        B, T = ids.shape
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        rep = nh // nkv
        end = start + T
        cos = self.cos[start:end].view(1, 1, T, hd)
        sin = self.sin[start:end].view(1, 1, T, hd)
        mask = None
        if T > 1:  # causal over the new tokens; everything cached before is visible
            mask = torch.full((T, end), float("-inf")).triu(start + 1)
        x = F.embedding(ids, self.embed)
        scale = 1.0 / math.sqrt(hd)
        for layer, (k_cache, v_cache) in zip(self.layers, cache):
            h = self.rms_norm(x, layer["in_norm"])
            q = F.linear(h, layer["q"], layer["q_b"]).view(B, T, nh, hd).transpose(1, 2)
            k = F.linear(h, layer["k"], layer["k_b"]).view(B, T, nkv, hd).transpose(1, 2)
            v = F.linear(h, layer["v"], layer["v_b"]).view(B, T, nkv, hd).transpose(1, 2)
            q = self.rope(q, cos, sin)
            k = self.rope(k, cos, sin)
            k_cache[:, :, start:end] = k
            v_cache[:, :, start:end] = v
            keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
            # [B, nkv, rep * T, hd]: the query heads of one kv head share its K/V.
            qg = q.reshape(B, nkv, rep * T, hd)
            scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale  # [B, nkv, rep*T, end]
            if mask is not None:
                scores = (scores.view(B, nkv, rep, T, end) + mask).view(B, nkv, rep * T, end)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            o = torch.matmul(probs, values).view(B, nh, T, hd).transpose(1, 2).reshape(B, T, nh * hd)
            x = x + F.linear(o, layer["o"])
            h = self.rms_norm(x, layer["post_norm"])
            x = x + F.linear(F.silu(F.linear(h, layer["gate"])) * F.linear(h, layer["up"]), layer["down"])
        x = self.rms_norm(x[:, -1], self.norm)
        return F.linear(x, self.head).float()


def main():
    spec = read_spec()
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    torch.set_num_threads(spec["threads"])
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(spec.get("seed", 0))

    t0 = time.perf_counter()
    model = Llama(spec["model_dir"], dtype)
    load_s = time.perf_counter() - t0
    rss_after_load = rss_kib("VmRSS")
    vocab = model.embed.shape[0]
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "interop_threads": torch.get_num_interop_threads(), "load_s": load_s,
              "weight_bytes": model.weight_bytes, "rss_after_load_kib": rss_after_load,
              "prefill": [], "decode": []}
    log(f"loaded {spec['model_dir']} as {spec['dtype']} in {load_s:.1f} s, "
        f"{torch.get_num_threads()} threads")

    # Warm-up: one short prefill and a few decode steps (allocator, oneDNN primitives).
    cache = model.new_cache(1, 80)
    model.forward(torch.randint(0, vocab, (1, 64), generator=gen), 0, cache)
    for i in range(4):
        model.forward(torch.randint(0, vocab, (1, 1), generator=gen), 64 + i, cache)
    del cache

    for p in spec["prefill"]:
        best = math.inf
        for _ in range(p["reps"]):
            cache = model.new_cache(p["batch"], p["tokens"])
            ids = torch.randint(0, vocab, (p["batch"], p["tokens"]), generator=gen)
            t = time.perf_counter()
            model.forward(ids, 0, cache)
            best = min(best, time.perf_counter() - t)
            del cache
        n = p["batch"] * p["tokens"]
        result["prefill"].append({"name": p["name"], "batch": p["batch"], "tokens": p["tokens"],
                                  "seconds": best, "tok_s": n / best})
        log(f"prefill {p['name']}: {n / best:.1f} tok/s")

    for d in spec["decode"]:
        B, prompt = d["batch"], d["prompt"]
        cache = model.new_cache(B, prompt + d["warmup"] + d["steps"])
        for k_cache, v_cache in cache:  # the prompt's K/V: random, as if prefilled
            k_cache[:, :, :prompt].normal_(generator=gen)
            v_cache[:, :, :prompt].normal_(generator=gen)
        tokens = torch.randint(0, vocab, (B, 1), generator=gen)
        pos = prompt
        for _ in range(d["warmup"]):
            tokens = model.forward(tokens, pos, cache).argmax(-1, keepdim=True)
            pos += 1
        seconds = float("inf")
        for _ in range(d.get("reps", 1)):
            pos = prompt + d["warmup"]  # the same positions (and so the same work) every pass
            t = time.perf_counter()
            for _ in range(d["steps"]):
                tokens = model.forward(tokens, pos, cache).argmax(-1, keepdim=True)
                pos += 1
            seconds = min(seconds, time.perf_counter() - t)
        kv_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in cache)
        result["decode"].append({"batch": B, "steps": d["steps"], "seconds": seconds,
                                 "tok_s": B * d["steps"] / seconds, "kv_bytes": kv_bytes})
        log(f"decode batch {B}: {B * d['steps'] / seconds:.1f} tok/s")
        del cache

    result["peak_rss_kib"] = rss_kib("VmHWM")
    emit(result)


if __name__ == "__main__":
    main()
