#!/usr/bin/env python3
"""Seed corpora of the round-2 fuzz targets (run with /usr/bin/python3 from tests/fuzz/):
corpus-http/ (raw HTTP requests, one per route and a few broken ones), corpus-sse/, corpus-job/,
corpus-jinja/ (the committed chat templates and small constructs) and corpus-tokenizer/ (small
tokenizer.json files). Deterministic: rerunning rewrites the same files."""
import json, pathlib

here = pathlib.Path(__file__).resolve().parent
root = here.parent.parent


def reset(name):
    """Empties corpus directory `name`, keeping the *tiny_char* seeds: those were copied from a
    `swarm-model init --preset tiny-char` directory (its tokenizer.json and chat template), and
    the regression-* inputs (crashes the fuzzers found, committed as they were)."""
    d = here / name
    d.mkdir(exist_ok=True)
    for f in d.iterdir():
        if "tiny_char" not in f.name and not f.name.startswith("regression"):
            f.unlink()
    return d


def write(d, name, data):
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# ---- HTTP: KEY / EPISODE / CLIENT are replaced by the harness (fuzz_http_request.cpp)
http = reset("corpus-http")


def req(method, path, body=None, headers=()):
    h = [f"{method} {path} HTTP/1.1", "Host: fuzz"] + list(headers)
    if body is not None:
        b = body if isinstance(body, str) else json.dumps(body)
        h += ["Content-Type: application/json", f"Content-Length: {len(b.encode())}"]
        return "\r\n".join(h) + "\r\n\r\n" + b
    return "\r\n".join(h) + "\r\n\r\n"


auth = ["Authorization: Bearer KEY"]
chat = {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
seeds = {
    "health": req("GET", "/health"),
    "status": req("GET", "/get_engine_status"),
    "pool": req("GET", "/get_current_batch_rollout_pool_information"),
    "metrics": req("GET", "/metrics"),
    "claim": req("POST", "/claim_episode", {"client_uuid": "CLIENT", "episode_type": "train", "discard_episode_timeout": 60}),
    "end": req("POST", "/end_episode", {"client_uuid": "CLIENT", "episode_uuid": "EPISODE",
                                         "task": {"task_id": "t1", "main_query": "q", "metadata": {}},
                                         "workflow_output": {"reward": 1.0, "turn_rewards": [1.0], "log_metrics": {"x": 1}}}),
    "abort": req("POST", "/abort_episode", {"client_uuid": "CLIENT", "episode_uuid": "EPISODE"}),
    "can_continue": req("POST", "/can_continue_episode", {"client_uuid": "CLIENT", "episode_uuid": "EPISODE"}),
    "agree": req("POST", "/agree_sync_weight", {"client_uuid": "CLIENT"}),
    "sync_config": req("POST", "/sync_train_config", {"yaml_as_string": "model: mock\nbatch_size: 2\nnum_repeat: 2\n"}),
    "stop": req("POST", "/stop_engine", {}),
    "experiment_dir": req("GET", "/get_server_experiment_dir"),
    "episode_buffer": req("POST", "/get_episode_buffer", {}),
    "replay": req("POST", "/replay_latest_llm_call", {}),
    "chat": req("POST", "/v1/chat/completions", chat, auth),
    "chat_stream": req("POST", "/v1/chat/completions", dict(chat, stream=True, stream_options={"include_usage": True}), auth),
    "chat_tools": req("POST", "/v1/chat/completions", dict(chat, tools=[{"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}],
        tool_choice="auto", n=2, logprobs=True, top_logprobs=2), auth),
    "chat_schema": req("POST", "/v1/chat/completions", dict(chat, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}), auth),
    "completions": req("POST", "/v1/completions", {"model": "mock", "prompt": "hi", "max_tokens": 4}, auth),
    "models": req("GET", "/v1/models", None, auth),
    "anthropic": req("POST", "/v1/messages", {"model": "mock", "max_tokens": 4, "system": "s",
                                              "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
                     ["x-api-key: KEY", "anthropic-version: 2023-06-01"]),
    "anthropic_count": req("POST", "/v1/messages/count_tokens", {"model": "mock", "messages": [{"role": "user", "content": "hi"}]},
                           ["x-api-key: KEY"]),
    "responses": req("POST", "/v1/responses", {"model": "mock", "input": "hi", "max_output_tokens": 4,
                                               "instructions": "be brief"}, auth),
    "chunked": "POST /v1/chat/completions HTTP/1.1\r\nHost: f\r\nAuthorization: Bearer KEY\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" + f"{len(json.dumps(chat)):x}\r\n{json.dumps(chat)}\r\n0\r\n\r\n",
    "bad_json": req("POST", "/end_episode", '{"client_uuid": "CLIENT", "episode_uuid": '),
    "wrong_types": req("POST", "/claim_episode", {"client_uuid": 5, "episode_type": ["train"], "discard_episode_timeout": "x"}),
    "unknown_route": req("GET", "/nope"),
    "wrong_method": req("GET", "/claim_episode"),
}
for k, v in seeds.items():
    write(http, k, v)

# ---- SSE: the first byte picks how the stream is cut
sse = reset("corpus-sse")
write(sse, "chat", b"\x03" + b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n')
write(sse, "crlf_multiline", b"\x01" + b": keep-alive\r\nevent: x\r\ndata: a\r\ndata: b\r\n\r\nid: 7\rdata:c\r\r")
write(sse, "unterminated", b"\x05" + b"data: last without blank line")

# ---- job configs
job = reset("corpus-job")
write(job, "flat", "model: /m\nbatch_size: 4\nnum_repeat: 8\nlearning_rate: 1.0e-5\nmax_staleness: 2\n"
                   "sample_collection_method: rollout_until_finish_enough_tasks\ndurable_episodes: false\n")
write(job, "defaults", (root / "tests" / "fixtures").exists() and "model: x\n" or "model: x\n")
write(job, "agentjet", "ajet:\n  model:\n    path: /m\n  data:\n    train_batch_size: 8\n  rollout:\n    num_repeat: 4\n"
                       "    max_env_worker: 16\n  trainer_common:\n    total_training_steps: 10\n")
write(job, "bad_types", "model: [1, 2]\nbatch_size: lots\n")

# ---- Jinja: the committed chat templates plus small constructs
jin = reset("corpus-jinja")
n = 0
for cfg in sorted((root / "tests" / "fixtures" / "tokenizers").glob("*/tokenizer_config.json")):
    try:
        t = json.loads(cfg.read_text()).get("chat_template")
    except Exception:
        continue
    if isinstance(t, str):
        write(jin, f"template_{cfg.parent.name}", t)
        n += 1
for i, t in enumerate([
    "{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}",
    "{% set ns = namespace(x=0) %}{% for i in range(5) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}",
    "{% macro f(a, b=2) %}{{ a * b }}{% endmacro %}{{ f(3) }}{{ tools | tojson }}",
    "{{ messages[0]['content'][1:3] ~ 'x' | upper }}{% if add_generation_prompt %}<|im_start|>{% endif %}",
    "{%- for t in tools -%}{{ t.function.name | replace('a','b') }}{%- endfor -%}{{ raise_exception('x') if false }}",
]):
    write(jin, f"construct_{i}", t)

# ---- tokenizer.json: the smallest committed tokenizers
tok = reset("corpus-tokenizer")
for p in sorted((root / "tests" / "fixtures" / "tokenizers").glob("*/tokenizer.json")):
    if p.stat().st_size < 64 * 1024:
        write(tok, p.parent.name, p.read_bytes())
write(tok, "tiny_bpe", json.dumps({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "decoder": {"type": "ByteLevel"}, "added_tokens": [{"id": 4, "content": "<|im_start|>", "special": True}]}))

# ---- hostile documents (docs/reliability.md, "Limits"): deep nesting, long keys, huge numbers.
# deep_end_episode is the regression input of the crash the nesting bound fixed: 100,000 nested
# arrays (about 200 KB) in an end_episode's metadata overflowed the stack where it was dumped.
def nested(n, leaf="0"):
    return "[" * n + leaf + "]" * n


def end_body(metadata_text, log_metrics_text='{"x": 1}', reward="1.0"):
    return ('{"client_uuid": "CLIENT", "episode_uuid": "EPISODE", "task": {"task_id": "t1", "main_query": "q"}, '
            '"workflow_output": {"reward": ' + reward + ', "metadata": {"deep": ' + metadata_text + '}, '
            '"log_metrics": ' + log_metrics_text + '}}')


deep_metrics = "1"
for i in range(120):
    deep_metrics = '{"k' + str(i) + '": ' + deep_metrics + "}"
hostile_http = {
    "deep_end_episode": req("POST", "/end_episode", end_body(nested(100000))),
    "deep_at_bound": req("POST", "/end_episode", end_body(nested(120))),
    "deep_objects": req("POST", "/end_episode", end_body('{"a":' * 5000 + "1" + "}" * 5000)),
    "deep_log_metrics": req("POST", "/end_episode", end_body("{}", deep_metrics)),
    "long_metric_key": req("POST", "/end_episode", end_body("{}", '{"' + "k" * 100000 + '": {"' + "j" * 1000 + '": 1}}')),
    "huge_numbers": req("POST", "/end_episode", end_body("[1e400, -1e400, 18446744073709551616, 1e-400]", '{"x": 1e308}',
                                                         "1e400")),
    "deep_chat": req("POST", "/v1/chat/completions",
                     '{"model": "mock", "max_tokens": 4, "messages": [{"role": "user", "content": ' + nested(50000, '"x"') + "}]}",
                     auth),
    "deep_tool_arguments": req("POST", "/v1/chat/completions", json.dumps(
        {"model": "mock", "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": ' + nested(20000) + "}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}), auth),
    "deep_responses": req("POST", "/v1/responses", '{"model": "mock", "input": ' + nested(20000, '"x"') + "}", auth),
    "deep_sync_config": req("POST", "/sync_train_config",
                            json.dumps({"yaml_as_string": "model: mock\nextra: " + nested(3000) + "\n"})),
}
for k, v in hostile_http.items():
    write(http, k, v)
write(job, "deep_flow", "model: x\nbatch_size: " + nested(200) + "\n")
write(job, "deep_over_yaml_guard", "model: x\nbatch_size: " + nested(5000) + "\n")
write(job, "deep_block", "model: x\nextra:\n" + "".join("  " * i + "- \n" for i in range(1, 300)))
write(tok, "deep", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": ' + nested(100000) + "}")
write(tok, "huge_numbers", '{"model": {"type": "BPE", "vocab": {"a": 1e400, "b": 18446744073709551616}, "merges": []}}')
sapo = here / "corpus-sapo"
write(sapo, "deep_task_metadata.json",
      '{"schema": 1, "node_id": "n1", "run": "r1", "model": "m", "task_id": "t", "policy_step": 0, "created": 1, '
      '"task_metadata": {"x": ' + nested(100000) + '}, "episodes": []}')
write(sapo, "huge_numbers.json",
      '{"schema": 1, "node_id": "n1", "run": "r1", "model": "m", "task_id": "t", "policy_step": 18446744073709551616, '
      '"created": 1e400, "episodes": [{"reward": 1e400}]}')
print(f"http {len(seeds)} + {len(hostile_http)} hostile, sse 3, job 4 + 3, jinja {n} templates + 5, "
      f"tokenizer {len(list(tok.iterdir()))}, sapo + 2")
