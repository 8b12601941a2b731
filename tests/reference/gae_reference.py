#!/usr/bin/python3
"""Independent reference for GAE over multi-turn samples, written the way verl's
compute_gae_advantage_return handles observation tokens: a loop from the last position to the
first over the whole padded row, where tokens with mask 0 pass the next value and the running
advantage through unchanged, then masked whitening (unbiased variance) over the batch.

stdin: {"gamma": float, "lam": float,
        "samples": [{"rewards": [float], "values": [float], "mask": [0|1]}]}
stdout: {"advantages": [[float]], "returns": [[float]], "whitened": [[float]]}
"""
import json
import sys

import numpy as np


def gae(rewards, values, mask, gamma, lam):
    n = len(mask)
    adv = np.zeros(n)
    next_value, last_gae = 0.0, 0.0
    for t in reversed(range(n)):
        delta = rewards[t] + gamma * next_value - values[t]
        candidate = delta + gamma * lam * last_gae
        # observation tokens: skip the TD error, carry value and advantage through
        next_value = values[t] * mask[t] + (1 - mask[t]) * next_value
        last_gae = candidate * mask[t] + (1 - mask[t]) * last_gae
        adv[t] = candidate * mask[t]
    returns = (adv + np.asarray(values)) * np.asarray(mask)
    return adv, returns


def main():
    req = json.load(sys.stdin)
    advs, rets = [], []
    for s in req["samples"]:
        a, r = gae(np.asarray(s["rewards"], dtype=np.float64), np.asarray(s["values"], dtype=np.float64),
                   np.asarray(s["mask"], dtype=np.float64), req["gamma"], req["lam"])
        advs.append(a)
        rets.append(r)
    flat = np.concatenate([a[np.asarray(s["mask"]) == 1] for a, s in zip(advs, req["samples"])])
    mean = flat.mean()
    var = flat.var(ddof=1) if flat.size > 1 else 0.0
    whitened = [((a - mean) / np.sqrt(var + 1e-8)) * np.asarray(s["mask"]) for a, s in zip(advs, req["samples"])]
    json.dump({"advantages": [a.tolist() for a in advs], "returns": [r.tolist() for r in rets],
               "whitened": [w.tolist() for w in whitened]}, sys.stdout)


main()
