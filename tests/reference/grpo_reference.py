#!/usr/bin/python3
"""Independent reference for one GRPO update (loss, gradients, AdamW step).

Uses the forward pass of llama_reference.py (plain torch from config.json + safetensors, one
sequence at a time, no padding) and torch's own autograd, clip_grad_norm_ and
torch.optim.AdamW, so the C++ trainer is checked against code that shares nothing with it.

stdin: {"model_dir": str,
        "param_names": [str],                  # order of the raw outputs
        "sequences": [{"ids": [int], "mask": [0|1], "advantage": float,
                       "old": [float],         # old log-prob per trained token (positions >= 1, mask 1)
                       "rollout": [float],     # behaviour log-prob per trained token (with "correction")
                       "temperature": [float]}],  # optional: sampling temperature per trained token (1)
        "correction": "none" | "tis" | "decoupled", "is_cap": float,   # optional (none)
        "norm": float,                         # trained tokens (token-mean) or sequences
        "agg": "token-mean" | "seq-mean-token-mean",
        "clip_low": float, "clip_high": float,
        "kl": null | {"coef": float, "estimator": "k1" | "k3"},
        "adamw": {"lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"},
        "out_grads": path, "out_weights": path}
Writes the gradients and the updated weights as raw little-endian float32, parameters in
param_names order, and prints {"loss", "pg_loss", "entropy_sum", "clipped_low",
"clipped_high", "tokens", "grad_norm", "is_weight_sum", "is_capped"} on stdout.
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
    # Tied embeddings: one tensor under both names, so both uses accumulate one gradient.
    leaves = {}
    for name in req["param_names"]:
        leaves[name] = w[name].clone().float().requires_grad_(True)
    for name in list(w):
        if name in leaves:
            w[name] = leaves[name]
    if "lm_head.weight" not in leaves and "lm_head.weight" in w:
        w["lm_head.weight"] = leaves["model.embed_tokens.weight"]
    frozen = {k: v.detach().clone() for k, v in w.items()}

    lo, hi = req["clip_low"], req["clip_high"]
    kl_cfg = req.get("kl")
    loss = torch.zeros((), dtype=torch.float64)
    pg_total = torch.zeros((), dtype=torch.float64)
    entropy_sum = 0.0
    clipped_low = clipped_high = tokens = 0
    correction, cap = req.get("correction", "none"), req.get("is_cap", 2.0)
    is_weight_sum = 0.0
    is_capped = 0
    for seq in req["sequences"]:
        ids = seq["ids"]
        mask = torch.tensor(seq["mask"][1:], dtype=torch.bool)
        targets = torch.tensor(ids[1:], dtype=torch.long)
        # Each trained token's log-prob is taken at the temperature it was sampled at:
        # log_softmax(logits / T) (positions without a trained token keep T = 1).
        temp = torch.ones(len(ids) - 1, dtype=torch.float32)
        if "temperature" in seq:
            temp[mask] = torch.tensor(seq["temperature"], dtype=torch.float32)
        logits = ref.forward(cfg, w, ids, torch.float32)[:-1] / temp[:, None]
        logp_all = torch.log_softmax(logits, -1)
        lp = logp_all.gather(1, targets[:, None])[:, 0][mask]
        old = torch.tensor(seq["old"], dtype=torch.float32)
        adv = torch.full_like(lp, seq["advantage"])
        ratio = torch.exp(lp - old)
        pg1 = -adv * ratio
        pg2 = -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
        pg = torch.maximum(pg1, pg2)
        # pi_old / pi_behaviour per token; counted over the cap whether or not it is applied.
        raw = torch.exp(old - torch.tensor(seq.get("rollout", seq["old"]), dtype=torch.float32))
        is_capped += int((raw > cap).sum())
        if correction != "none":
            # Off-policy correction: the ratio truncated at the cap (tis) or zero above it
            # (decoupled), constant in the gradient.
            if correction == "tis":
                isw = torch.clamp(raw, max=cap)
            else:
                isw = torch.where(raw > cap, torch.zeros_like(raw), raw)
            pg = pg * isw
            is_weight_sum += float(isw.sum())
        weight = 1.0 if req["agg"] == "token-mean" else 1.0 / lp.numel()
        term = (pg * weight).sum() / req["norm"]
        pg_total = pg_total + term.double()
        if kl_cfg:
            with torch.no_grad():
                ref_lp = torch.log_softmax(ref.forward(cfg, frozen, ids, torch.float32)[:-1] / temp[:, None], -1)
                ref_lp = ref_lp.gather(1, targets[:, None])[:, 0][mask]
            if kl_cfg["estimator"] == "k1":
                kl = lp - ref_lp
            else:
                # k3, bounded as verl's low_var_kl: the log-ratio to +-20, the value to +-10.
                d = torch.clamp(ref_lp - lp, -20, 20)
                kl = torch.clamp(torch.exp(d) - d - 1, -10, 10)
            term = term + kl_cfg["coef"] * (kl * weight).sum() / req["norm"]
        loss = loss + term.double()
        with torch.no_grad():
            p = logp_all[mask]
            entropy_sum += float(-(p.exp() * p).sum())
            clipped = pg2 > pg1
            clipped_low += int((clipped & (ratio < 1)).sum())
            clipped_high += int((clipped & (ratio > 1)).sum())
            tokens += int(lp.numel())
    loss.backward()

    params = [leaves[n] for n in req["param_names"]]
    with open(req["out_grads"], "wb") as f:
        for p in params:
            f.write(p.grad.detach().contiguous().numpy().astype("<f4").tobytes())

    a = req["adamw"]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, a["grad_clip"])
    kwargs = dict(lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"], weight_decay=a["weight_decay"])
    try:
        opt = torch.optim.AdamW(params, foreach=False, **kwargs)
    except TypeError:
        opt = torch.optim.AdamW(params, **kwargs)
    opt.step()
    with open(req["out_weights"], "wb") as f:
        for p in params:
            f.write(p.detach().contiguous().numpy().astype("<f4").tobytes())

    json.dump({"loss": float(loss), "pg_loss": float(pg_total), "entropy_sum": entropy_sum,
               "clipped_low": clipped_low, "clipped_high": clipped_high, "tokens": tokens,
               "grad_norm": float(grad_norm), "is_weight_sum": is_weight_sum, "is_capped": is_capped},
              sys.stdout)


if __name__ == "__main__":
    main()
