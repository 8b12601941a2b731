"""What the benchmarks' python3-torch references share (bench/inference/python_reference.py,
bench/trainer/python_reference.py): the spec they are given, progress lines, memory readings,
the model shape from config.json, and the result line. The C++ half is
bench/common/torch_bench.hpp (run_python_reference).

Protocol: the benchmark writes a JSON spec to a file and runs `python3 SCRIPT SPEC_FILE`; the
script logs progress to stderr and prints its result as one JSON object on the last line of
stdout.
"""
import importlib.util
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def load_llama_reference():
    """tests/reference/llama_reference.py as a module (its safetensors loader, RoPE, norms)."""
    spec = importlib.util.spec_from_file_location(
        "llama_reference", os.path.join(_HERE, "..", "..", "tests", "reference", "llama_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_spec():
    """The spec: the JSON object in the file named by the first argument."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {os.path.basename(sys.argv[0])} SPEC_JSON_FILE")
    with open(sys.argv[1]) as f:
        return json.load(f)


def log(msg):
    sys.stderr.write(f"[python] {msg}\n")
    sys.stderr.flush()


def rss_kib(field):
    """A field of /proc/self/status in KiB (VmRSS, VmHWM), or 0."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def emit(result):
    """The result: one JSON object, the last line of stdout."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


class ModelShape:
    """The sizes of a Llama-family model from its config.json (kept as `cfg`)."""

    def __init__(self, model_dir, dtype):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.cfg = cfg
        self.dtype = dtype
        self.hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.n_layers = cfg["num_hidden_layers"]
        self.max_pos = cfg["max_position_embeddings"]
