#!/usr/bin/python3
"""Independent reference for PPO's critic: values from a value head on the final
normed hidden states, and verl's clipped value loss with its gradients.

Uses the forward pass of llama_reference.py (plain torch from config.json + safetensors, one
sequence at a time, no padding) and torch's autograd. The value of the state before trained
token t (position t >= 1, mask 1) is read at position t - 1.

stdin: {"model_dir": str,
        "param_names": [str],                 # trunk parameters, in the order of the raw output
        "head": {"weight": [float], "bias": float},
        "sequences": [{"ids": [int], "mask": [0|1],
                       "returns": [float], "old_values": [float]}],   # per trained token
        "norm": float, "agg": "token-mean" | "seq-mean-token-mean", "cliprange": float,
        "out_grads": path}
Writes the gradients of param_names then value_head.weight then value_head.bias as raw
little-endian float32, and prints {"loss", "values": [[float]], "clipped"} on stdout.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402


def main():
    req = json.load(sys.stdin)
    cfg = json.load(open(os.path.join(req["model_dir"], "config.json")))
    w = ref.load_weights(req["model_dir"])
    leaves = {name: w[name].clone().float().requires_grad_(True) for name in req["param_names"]}
    for name in leaves:
        w[name] = leaves[name]
    head_w = torch.tensor(req["head"]["weight"], dtype=torch.float32, requires_grad=True)
    head_b = torch.tensor([req["head"]["bias"]], dtype=torch.float32, requires_grad=True)

    c = req["cliprange"]
    loss = torch.zeros((), dtype=torch.float64)
    values_out, clipped = [], 0
    for seq in req["sequences"]:
        ids = seq["ids"]
        mask = torch.tensor(seq["mask"][1:], dtype=torch.bool)
        h = ref.hidden_states(cfg, w, ids, torch.float32)[:-1][mask]
        v = h @ head_w + head_b
        old = torch.tensor(seq["old_values"], dtype=torch.float32)
        ret = torch.tensor(seq["returns"], dtype=torch.float32)
        v_clipped = old + torch.clamp(v - old, -c, c)
        l1 = (v - ret) ** 2
        l2 = (v_clipped - ret) ** 2
        per_token = 0.5 * torch.maximum(l1, l2)
        weight = 1.0 if req["agg"] == "token-mean" else 1.0 / v.numel()
        loss = loss + ((per_token * weight).sum() / req["norm"]).double()
        values_out.append(v.detach().tolist())
        clipped += int((l2 > l1).sum())
    loss.backward()
    with open(req["out_grads"], "wb") as f:
        for p in [leaves[n] for n in req["param_names"]] + [head_w, head_b]:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            f.write(g.detach().contiguous().numpy().astype("<f4").tobytes())
    json.dump({"loss": float(loss), "values": values_out, "clipped": clipped}, sys.stdout)


if __name__ == "__main__":
    main()
