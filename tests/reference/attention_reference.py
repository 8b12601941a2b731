#!/usr/bin/python3
"""Independent reference for packed causal attention (kernels/cpu/blockwise_attention_torch.hpp).

The plain formula on torch in float64, one sample at a time: scores = q·kᵀ·scale, keys after the
query (or `window` or more positions back) masked, softmax, times v; query head h reads kv head
h // (heads // kv_heads). Gradients by torch.autograd from `dout`.

stdin:  {"q": [[[...]]], "k": ..., "v": ..., "dout": ..., "cu_seqlens": [...], "window": int,
         "scale": float}   (q/dout [N, heads, hd], k/v [N, kv_heads, hd])
stdout: {"out": ..., "dq": ..., "dk": ..., "dv": ...}
"""
import json
import sys

import torch


def main():
    req = json.load(sys.stdin)
    q = torch.tensor(req["q"], dtype=torch.float64, requires_grad=True)
    k = torch.tensor(req["k"], dtype=torch.float64, requires_grad=True)
    v = torch.tensor(req["v"], dtype=torch.float64, requires_grad=True)
    dout = torch.tensor(req["dout"], dtype=torch.float64)
    cu = req["cu_seqlens"]
    window = req["window"]
    scale = req["scale"]
    heads, kv_heads = q.shape[1], k.shape[1]
    rep = heads // kv_heads
    outs = []
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        n = b - a
        qs = q[a:b].transpose(0, 1)  # [heads, n, hd]
        ks = k[a:b].transpose(0, 1).repeat_interleave(rep, dim=0)
        vs = v[a:b].transpose(0, 1).repeat_interleave(rep, dim=0)
        scores = qs @ ks.transpose(1, 2) * scale
        i = torch.arange(n).view(n, 1)
        j = torch.arange(n).view(1, n)
        blocked = j > i
        if window > 0:
            blocked = blocked | ((i - j) >= window)
        scores = scores.masked_fill(blocked, float("-inf"))
        outs.append((torch.softmax(scores, dim=-1) @ vs).transpose(0, 1))
    out = torch.cat(outs, dim=0)
    out.backward(dout)
    json.dump({"out": out.tolist(), "dq": q.grad.tolist(), "dk": k.grad.tolist(), "dv": v.grad.tolist()},
              sys.stdout)


if __name__ == "__main__":
    main()
