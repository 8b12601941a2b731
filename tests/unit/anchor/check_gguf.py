#!/usr/bin/python3
"""Checks a GGUF file written by bench_anchor's writer (bench/anchor/gguf_writer.cpp) against the
Hugging Face model it was converted from, with a reader written here from the GGUF v3 layout
(ggml's docs/gguf.md), sharing no code with the writer:

  header (magic, version 3, counts), every metadata value bench_anchor promises (the llama.*
  hyper-parameters from config.json, the vocabulary in id order and the merges from
  tokenizer.json), every tensor (name map, ggml dims = the reversed shape, type: 2-D weights in
  the requested type, norms F32), offsets aligned inside the file, and the data: the source
  values converted here (F16 with numpy's round-to-nearest-even, BF16 rounded to nearest even on
  the bits), the q/k projection rows permuted for ggml's adjacent-pair RoPE.

  check_gguf.py MODEL_DIR FILE.gguf F32|F16|BF16       exit 0 when every check holds
"""
import json
import struct
import sys

import numpy as np

GGML_TYPES = {"F32": 0, "F16": 1, "BF16": 30}
ELEMENT = {0: 4, 1: 2, 30: 2}


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError(f"truncated at byte {self.pos}")
        out = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return out[0] if len(out) == 1 else out

    def string(self):
        n = self.take("Q")
        raw = self.data[self.pos:self.pos + n]
        if len(raw) != n:
            raise ValueError("truncated string")
        self.pos += n
        return raw.decode("utf-8")

    def value(self, vtype):
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 10: "Q", 11: "q", 12: "d"}
        if vtype in scalar:
            return self.take(scalar[vtype])
        if vtype == 7:
            b = self.take("B")
            if b not in (0, 1):
                raise ValueError(f"bool byte {b}")
            return bool(b)
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item_type = self.take("I")
            count = self.take("Q")
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"unknown value type {vtype}")


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": None}[info["dtype"]]
        begin, end = info["data_offsets"]
        buf = raw[8 + n + begin:8 + n + end]
        if dtype is None:
            arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype).astype(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def to_bf16_bits(a):
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest, ties to even
    return rounded.astype(np.uint16)


def rope_permute(w, n_head):
    """HF rotate-half rows -> ggml adjacent pairs: row (head h, half j, i) goes to (h, 2i + j)."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_name(hf):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    layer, rest = parts[2], ".".join(parts[3:])
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight"}
    return f"blk.{layer}.{per_layer[rest]}"


def main():
    model_dir, gguf_path, type_name = sys.argv[1], sys.argv[2], sys.argv[3]
    want_type = GGML_TYPES[type_name]
    config = json.load(open(f"{model_dir}/config.json"))
    tokenizer = json.load(open(f"{model_dir}/tokenizer.json"))
    source = read_safetensors(f"{model_dir}/model.safetensors")
    data = open(gguf_path, "rb").read()
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    r = Reader(data)
    magic, version, n_tensors, n_kv = r.take("I"), r.take("I"), r.take("Q"), r.take("Q")
    check(magic == 0x46554747, f"magic {magic:#x}")
    check(version == 3, f"version {version}")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        check(key not in kv, f"duplicate key {key}")
        kv[key] = r.value(r.take("I"))

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    expect = {
        "general.architecture": "llama",
        "llama.block_count": config["num_hidden_layers"],
        "llama.embedding_length": config["hidden_size"],
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.context_length": config["max_position_embeddings"],
        "llama.rope.dimension_count": head_dim,
        "llama.vocab_size": config["vocab_size"],
        "tokenizer.ggml.model": "gpt2",
    }
    for key, value in expect.items():
        check(kv.get(key) == value, f"{key} = {kv.get(key)!r}, expected {value!r}")
    check(abs(kv.get("llama.rope.freq_base", 0) - config["rope_theta"]) <= 1e-3 * config["rope_theta"],
          "llama.rope.freq_base")
    check(abs(kv.get("llama.attention.layer_norm_rms_epsilon", 0) - config["rms_norm_eps"]) <= 1e-3 * config["rms_norm_eps"],
          "llama.attention.layer_norm_rms_epsilon")

    # The vocabulary in id order: the model's ids plus the added tokens.
    vocab = dict(tokenizer["model"]["vocab"])
    for added in tokenizer.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = kv.get("tokenizer.ggml.tokens", [])
    by_id = {i: t for t, i in vocab.items()}
    check(len(tokens) == config["vocab_size"], f"{len(tokens)} tokens for a vocabulary of {config['vocab_size']}")
    mismatched = [i for i, t in enumerate(tokens) if i in by_id and by_id[i] != t]
    check(not mismatched, f"tokens differ from tokenizer.json at ids {mismatched[:5]}")
    check(len(kv.get("tokenizer.ggml.token_type", [])) == len(tokens), "token_type count")
    merges = tokenizer["model"].get("merges", [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    check(kv.get("tokenizer.ggml.merges") == merges, "merges differ from tokenizer.json")

    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("I")
        dims = [r.take("Q") for _ in range(n_dims)]
        ttype = r.take("I")
        offset = r.take("Q")
        infos.append((name, dims, ttype, offset))
    alignment = kv.get("general.alignment", 32)
    data_start = (r.pos + alignment - 1) // alignment * alignment
    check(len(data) >= data_start, "file ends before the data section")

    expected_names = {gguf_name(n): n for n in source}
    if config.get("tie_word_embeddings"):
        # One matrix for both (stored under either name): token_embd.weight, and no output.weight.
        tied = "model.embed_tokens.weight" if "model.embed_tokens.weight" in source else "lm_head.weight"
        expected_names.pop("output.weight", None)
        expected_names["token_embd.weight"] = tied
    seen = set()
    for name, dims, ttype, offset in infos:
        if name not in expected_names:
            failures.append(f"unexpected tensor {name}")
            continue
        seen.add(name)
        src = source[expected_names[name]]
        check(list(reversed(dims)) == list(src.shape), f"{name}: dims {dims} for shape {list(src.shape)}")
        want = want_type if src.ndim == 2 else 0
        check(ttype == want, f"{name}: type {ttype}, expected {want}")
        check(offset % alignment == 0, f"{name}: offset {offset} not aligned to {alignment}")
        size = src.size * ELEMENT.get(ttype, 4)
        begin = data_start + offset
        if begin + size > len(data):
            failures.append(f"{name}: data past the end of the file")
            continue
        expected = src
        if name.endswith("attn_q.weight"):
            expected = rope_permute(src, heads)
        elif name.endswith("attn_k.weight"):
            expected = rope_permute(src, kv_heads)
        raw = data[begin:begin + size]
        if ttype == 0:
            got_ok = np.array_equal(np.frombuffer(raw, np.float32).reshape(src.shape), expected.astype(np.float32))
        elif ttype == 1:
            got_ok = np.array_equal(np.frombuffer(raw, np.uint16), expected.astype(np.float16).view(np.uint16).ravel())
        else:
            got_ok = np.array_equal(np.frombuffer(raw, np.uint16), to_bf16_bits(expected).ravel())
        check(got_ok, f"{name}: data differs from the converted source")
    missing = set(expected_names) - seen
    check(not missing, f"tensors missing: {sorted(missing)[:5]}")
    # The permutation must move rows (a check that cannot pass by leaving them in place).
    q = source.get("model.layers.0.self_attn.q_proj.weight")
    if q is not None:
        check(not np.array_equal(rope_permute(q, heads), q), "q rows unchanged by the permutation")

    if failures:
        for f in failures:
            print("FAIL:", f)
        return 1
    print(f"ok: {gguf_path}: GGUF v{version}, {n_tensors} tensors, {n_kv} keys, {type_name}, {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
