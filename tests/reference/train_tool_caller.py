#!/usr/bin/python3
"""Teaches a tiny randomly initialised model one fixed conversation, so that a test can drive a
real tool loop on the torch engine (tests/js/exact_tokens.mjs).

The model learns, by teacher forcing on one token sequence, to generate the tokens at the
given target ranges from everything before them (the tool calls and the final answer of a
three-turn conversation), until greedy decoding picks every target token by a margin of at
least `margin` logits. Full-precision Adam on every weight, with the forward pass of
llama_reference.py. The weights are written back in place (model.safetensors, F32).

stdin:  {"model_dir": str, "sequence": [ids], "targets": [[begin, end], ...] (token positions),
         "max_steps": int, "lr": float, "margin": float, "seed": int}
stdout: {"steps": int, "loss": float, "min_margin": float}; exit 1 when not reached.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_reference import hidden_states, load_weights  # noqa: E402


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().float().numpy().astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    req = json.load(sys.stdin)
    model_dir = req["model_dir"]
    torch.manual_seed(req.get("seed", 0))
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    stored = load_weights(model_dir)
    path = os.path.join(model_dir, "model.safetensors")
    assert os.path.exists(path), "expects one model.safetensors (a tiny model)"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]  # written back as stored
    w = {n: t.float().clone().requires_grad_(True) for n, t in stored.items()}
    seq = req["sequence"]
    positions = [p for b, e in req["targets"] for p in range(b, e)]
    assert positions and min(positions) >= 1 and max(positions) < len(seq), "targets out of range"
    pos = torch.tensor([p - 1 for p in positions])  # the position whose output predicts token p
    want = torch.tensor([seq[p] for p in positions])
    opt = torch.optim.Adam(list(w.values()), lr=req.get("lr", 3e-3))
    margin_goal = req.get("margin", 3.0)
    head_name = "lm_head.weight" if "lm_head.weight" in w else "model.embed_tokens.weight"
    loss_v, min_margin, step = float("nan"), float("-inf"), 0
    for step in range(1, req.get("max_steps", 1000) + 1):
        x = hidden_states(cfg, w, seq, torch.float32)[pos]
        logits = x @ w[head_name].T
        loss = torch.nn.functional.cross_entropy(logits, want)
        with torch.no_grad():
            right = logits.gather(1, want[:, None]).squeeze(1)
            others = logits.clone()
            others.scatter_(1, want[:, None], float("-inf"))
            min_margin = float((right - others.max(1).values).min())
        loss_v = float(loss)
        if min_margin >= margin_goal:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss_v:.4f}, min margin {min_margin:.2f}", file=sys.stderr)
    write_safetensors(path, {n: w[n] for n in names})
    json.dump({"steps": step, "loss": loss_v, "min_margin": min_margin}, sys.stdout)
    sys.exit(0 if min_margin >= margin_goal else 1)


if __name__ == "__main__":
    main()
