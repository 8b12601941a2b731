#!/usr/bin/python3
"""The Python baseline of bench_trainer: one GRPO policy step written the way a careful user of
torch eager writes it on the CPU.

Model: a Llama-family decoder on a right-padded batch [B, T] with one causal + padding mask
(the Hugging Face eager layout: separate q/k/v/o and gate/up/down projections through F.linear,
RMSNorm statistics in fp32, rotate-half RoPE, attention matmuls in the compute dtype with the
softmax in fp32, grouped-query heads sharing their K/V through a reshape). The LM head runs only
at the positions that predict a trained (loss-mask 1) token, as the C++ trainer does.
Loss: PPO-clip, token-mean over the mini-batch, old log-probs = the current ones detached (the
on-policy case), plus the policy entropy as a metric. loss.backward() per micro-batch,
torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW.

Precision:
  fp32: fp32 parameters are the leaves; AdamW updates them directly.
  bf16: bf16 parameters are the leaves (bf16 compute and bf16 gradients, no autocast: casting
        fp32 weights on every forward would be slower); after each micro-batch's backward the
        gradient is added into an fp32 master copy's .grad; clipping and AdamW run on the fp32
        masters, which are then copied back into the bf16 parameters. This is the same scheme
        as the C++ trainer (bf16 weights, fp32 gradient accumulation, fp32 master + moments).
The weights are read from the same model directory with tests/reference/llama_reference.py's
loader (json + numpy, no safetensors / transformers package); it shares no code with the C++.

Usage: python_reference.py SPEC_JSON_FILE (bench/common/reference_common.py), where the file holds
  {"model_dir": str, "dtype": "fp32"|"bf16", "threads": int, "warmup": int, "steps": int,
   "sequences": [{"ids": [int], "mask": [0|1], "advantage": float}],
   "micro_batches": [[sequence index, ...], ...], "norm": float,
   "clip_low": float, "clip_high": float,
   "adamw": {"lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"}, "foreach": bool}
Prints one JSON object to stdout (progress goes to stderr):
  {"torch", "threads", "load_s", "tokens_per_step", "steps", "step_s" (mean), "step_min_s",
   "forward_s", "backward_s", "optimizer_s" (means per step), "loss", "grad_norm",
   "sys_s", "minflt" (kernel CPU seconds and minor page faults per step, all threads),
   "first_grad_norm" (of the first warm-up step, from the checkpoint's weights), "peak_rss_kib"}
"""
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from reference_common import ModelShape, emit, load_llama_reference, log, read_spec, rss_kib  # noqa: E402

ref = load_llama_reference()


class Llama(ModelShape):
    """Parameters by Hugging Face name (tied head = the embedding tensor), batched forward."""

    def __init__(self, model_dir, dtype):
        super().__init__(model_dir, dtype)
        cfg = self.cfg
        w = ref.load_weights(model_dir)
        self.fp32 = w  # the checkpoint as loaded (fp32 here): the bf16 run's master weights
        self.tied = "lm_head.weight" not in w or cfg.get("tie_word_embeddings", False)
        # The leaves: one tensor per distinct weight (a tied head is the embedding).
        self.params = {}
        for name, t in w.items():
            if name == "lm_head.weight" and self.tied:
                continue
            self.params[name] = t.to(dtype).contiguous().requires_grad_(True)
        inv = ref.rope_inv_freq(cfg, self.head_dim)
        ang = torch.arange(cfg["max_position_embeddings"], dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        self.cos = ang.cos().float().to(dtype)
        self.sin = ang.sin().float().to(dtype)

    def p(self, name):
        return self.params[name]

    def head_weight(self):
        return self.params["model.embed_tokens.weight" if self.tied else "lm_head.weight"]

    def hidden_states(self, ids, lengths):
        """ids [B, T] int64, lengths [B] -> the residual stream after the last layer [B, T, H]."""
        B, T = ids.shape
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        rep = nh // nkv
        i = torch.arange(T).view(1, T, 1)
        j = torch.arange(T).view(1, 1, T)
        # Future keys and padding keys are blocked; a padded query still sees itself.
        allowed = (j <= i) & ((j < lengths.view(B, 1, 1)) | (j == i))
        mask = torch.zeros(B, 1, 1, T, T).masked_fill_(~allowed.view(B, 1, 1, T, T), float("-inf"))
        mask = mask.to(self.dtype)
        cos = self.cos[:T].view(1, 1, T, hd)
        sin = self.sin[:T].view(1, 1, T, hd)
        scale = 1.0 / math.sqrt(hd)
        x = F.embedding(ids, self.p("model.embed_tokens.weight"))
        for l in range(self.n_layers):
            pre = f"model.layers.{l}."
            g = lambda n: self.params.get(pre + n)
            h = ref.rms_norm(x, g("input_layernorm.weight"), self.eps)
            heads = lambda name, n: (F.linear(h, g(f"self_attn.{name}.weight"), g(f"self_attn.{name}.bias"))
                                     .view(B, T, n, hd).transpose(1, 2))
            q, k, v = heads("q_proj", nh), heads("k_proj", nkv), heads("v_proj", nkv)
            q = ref.rotate(q, cos, sin)
            k = ref.rotate(k, cos, sin)
            qg = q.reshape(B, nkv, rep * T, hd)  # the query heads of one kv head share its K/V
            scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [B, nkv, rep*T, T]
            scores = (scores.view(B, nkv, rep, T, T) + mask).view(B, nkv, rep * T, T)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            o = torch.matmul(probs, v).view(B, nh, T, hd).transpose(1, 2).reshape(B, T, nh * hd)
            x = x + F.linear(o, g("self_attn.o_proj.weight"), g("self_attn.o_proj.bias"))
            h = ref.rms_norm(x, g("post_attention_layernorm.weight"), self.eps)
            gate = F.linear(h, g("mlp.gate_proj.weight"))
            up = F.linear(h, g("mlp.up_proj.weight"))
            x = x + F.linear(F.silu(gate) * up, g("mlp.down_proj.weight"))
        return x

    def head_logits(self, h):
        h = ref.rms_norm(h, self.p("model.norm.weight"), self.eps)
        return F.linear(h, self.head_weight()).float()


def micro_inputs(seqs, micro):
    """Padded ids [B, T], lengths [B], and the trained tokens: flat positions b*T + t-1, targets,
    advantages (as the C++ trainer builds them)."""
    B = len(micro)
    T = max(len(seqs[s]["ids"]) for s in micro)
    ids = torch.zeros(B, T, dtype=torch.long)
    lengths, positions, targets, adv = [], [], [], []
    for b, s in enumerate(micro):
        seq = seqs[s]
        n = len(seq["ids"])
        ids[b, :n] = torch.tensor(seq["ids"], dtype=torch.long)
        lengths.append(n)
        for t in range(1, n):
            if seq["mask"][t]:
                positions.append(b * T + t - 1)
                targets.append(seq["ids"][t])
                adv.append(seq["advantage"])
    return (ids, torch.tensor(lengths, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
            torch.tensor(targets, dtype=torch.long), torch.tensor(adv, dtype=torch.float32))


def main():
    spec = read_spec()
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    model = Llama(spec["model_dir"], dtype)
    load_s = time.perf_counter() - t0
    leaves = list(model.params.values())
    if dtype == torch.float32:
        masters = leaves
    else:
        masters = [model.fp32[name].float().clone().requires_grad_(True) for name in model.params]
        for m in masters:
            m.grad = torch.zeros_like(m)
    del model.fp32
    a = spec["adamw"]
    opt = torch.optim.AdamW(masters, lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"],
                            weight_decay=a["weight_decay"], foreach=spec.get("foreach", False))
    lo, hi = spec["clip_low"], spec["clip_high"]
    norm = spec["norm"]
    seqs = spec["sequences"]
    inputs = [micro_inputs(seqs, m) for m in spec["micro_batches"]]
    tokens_per_step = sum(len(s["ids"]) for s in seqs)
    log(f"loaded {spec['model_dir']} as {spec['dtype']} in {load_s:.1f} s, {torch.get_num_threads()} threads, "
        f"{len(inputs)} micro-batches, {tokens_per_step} tokens/step")

    def step():
        fwd = bwd = 0.0
        loss_total = entropy_total = 0.0
        if dtype == torch.float32:
            opt.zero_grad(set_to_none=True)
        else:
            for m in masters:
                m.grad.zero_()
        for ids, lengths, positions, targets, adv in inputs:
            t = time.perf_counter()
            hidden = model.hidden_states(ids, lengths)
            h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
            logp_all = torch.log_softmax(model.head_logits(h), -1)
            with torch.no_grad():
                entropy = -(logp_all.exp() * logp_all).sum(-1)
            lp = logp_all.gather(1, targets[:, None]).squeeze(1)
            old = lp.detach()
            ratio = torch.exp(lp - old)
            pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - lo, 1.0 + hi))
            loss = pg.sum() / norm
            t1 = time.perf_counter()
            loss.backward()
            if dtype != torch.float32:
                with torch.no_grad():
                    for p, m in zip(leaves, masters):
                        if p.grad is not None:
                            m.grad.add_(p.grad)
                            p.grad = None
            loss_total += loss.item()  # the metrics the C++ trainer reads back too
            entropy_total += entropy.sum().item()
            t2 = time.perf_counter()
            fwd += t1 - t
            bwd += t2 - t1
        t = time.perf_counter()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(masters, a["grad_clip"]))
        opt.step()
        if dtype != torch.float32:
            with torch.no_grad():
                for p, m in zip(leaves, masters):
                    p.copy_(m)
        return fwd, bwd, time.perf_counter() - t, loss_total, grad_norm

    first_grad_norm = None  # of the first step (from the checkpoint's weights): a parity check
    for _ in range(spec.get("warmup", 1)):
        *_, grad_norm = step()
        if first_grad_norm is None:
            first_grad_norm = grad_norm
    times, fwds, bwds, opts = [], [], [], []
    loss = grad_norm = 0.0
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    for k in range(spec["steps"]):
        t = time.perf_counter()
        f, b, o, loss, grad_norm = step()
        times.append(time.perf_counter() - t)
        fwds.append(f)
        bwds.append(b)
        opts.append(o)
        log(f"step {k + 1}: {times[-1]:.2f} s ({tokens_per_step / times[-1]:.1f} tok/s; fwd {f:.2f} bwd {b:.2f} "
            f"opt {o:.2f})")
    n = len(times)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "load_s": load_s,
           "tokens_per_step": tokens_per_step, "steps": n, "step_s": sum(times) / n, "step_min_s": min(times),
           "forward_s": sum(fwds) / n, "backward_s": sum(bwds) / n, "optimizer_s": sum(opts) / n,
           "sys_s": (ru1.ru_stime - ru0.ru_stime) / n, "minflt": (ru1.ru_minflt - ru0.ru_minflt) / n,
           "loss": loss, "grad_norm": grad_norm, "first_grad_norm": first_grad_norm,
           "peak_rss_kib": rss_kib("VmHWM")}
    emit(out)


if __name__ == "__main__":
    main()
