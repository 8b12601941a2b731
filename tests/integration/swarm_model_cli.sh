#!/usr/bin/env bash
# swarm-model end to end on the model and tokenizer fixtures (tests/fixtures): inspect, deterministic init,
# tokenize/detokenize round trip, render-chat consistent with tokenize, clear errors.
# Usage: swarm_model_cli.sh <swarm-model> <fixtures-dir>
set -euo pipefail
bin="$1" fixtures="$2"
tiny="$fixtures/models/tinystories-656k" smol="$fixtures/models/smollm2-135m-instruct-noweights"
qwen="$fixtures/tokenizers/qwen3"
[ -d "$tiny" ] || { echo "FAIL: fixtures missing at $fixtures"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

"$bin" inspect "$tiny" >"$work/inspect.json" || fail "inspect"
$py - "$work/inspect.json" <<'PY' || fail "inspect content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["architecture"] == "LlamaForCausalLM", d["architecture"]
assert d["parameters_from_config"] == d["parameters_from_tensors"] == 656000
PY

"$bin" init --from "$tiny" --out "$work/a" --seed 7 --dtype f32 >/dev/null || fail "init a"
"$bin" init --from "$tiny" --out "$work/b" --seed 7 --dtype f32 >/dev/null || fail "init b"
cmp -s "$work/a/model.safetensors" "$work/b/model.safetensors" || fail "same seed gave different weights"
"$bin" inspect "$work/a" >/dev/null || fail "inspect of an init'd model"

# --set: a small model of SmolLM2's layout (head_dim re-derived from the new width).
"$bin" init --from "$smol" --out "$work/small" --dtype f32 --set hidden_size=64 --set intermediate_size=128 \
  --set num_hidden_layers=2 --set num_attention_heads=4 --set num_key_value_heads=2 >/dev/null || fail "init --set"
"$bin" inspect "$work/small" >"$work/small.json" || fail "inspect of a --set model"
$py - "$work/small.json" <<'PY' || fail "--set content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["layers"] == 2 and d["hidden_size"] == 64 and d["head_dim"] == 16, d
assert d["parameters_from_config"] == d["parameters_from_tensors"], d
PY
[ -f "$work/small/chat_template.jinja" ] || fail "--set model lost the tokenizer files"
if "$bin" init --from "$smol" --out "$work/bad" --set novalue 2>"$work/err.txt"; then fail "--set without = accepted"; fi
grep -q "KEY=VALUE" "$work/err.txt" || fail "--set error message: $(cat "$work/err.txt")"

text="Once upon a time, a little dog found a big red ball."
for dir in "$tiny" "$smol" "$qwen"; do
  ids="$("$bin" tokenize --model "$dir" --no-special --text "$text")"
  back="$(echo "$ids" | "$bin" detokenize --model "$dir")"
  [ "$back" = "$text" ] || fail "round trip on $dir: '$back'"
  stdin_ids="$(printf '%s' "$text" | "$bin" tokenize --model "$dir" --no-special)"
  [ "$ids" = "$stdin_ids" ] || fail "stdin and --text differ on $dir"
done

printf '%s' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "add_generation_prompt": true, "enable_thinking": false}' >"$work/req.json"
for dir in "$smol" "$qwen"; do
  "$bin" render-chat --model "$dir" "$work/req.json" >"$work/render.json" || fail "render-chat on $dir"
  # Through a file: $(...) would strip the prompt's trailing newline.
  $py -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompt"])' "$work/render.json" >"$work/prompt.txt"
  prompt="$(cat "$work/prompt.txt")"
  want="$("$bin" tokenize --model "$dir" --no-special <"$work/prompt.txt")"
  got="$($py -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["ids"], separators=(",", ":")))' "$work/render.json")"
  [ "$want" = "$got" ] || fail "render-chat ids differ from tokenize of its prompt on $dir"
  case "$prompt" in *"2+2?"*) ;; *) fail "prompt lacks the user message on $dir";; esac
done

if echo '[99999999]' | "$bin" detokenize --model "$smol" 2>"$work/err"; then fail "bad id accepted"; fi
grep -q "not in the vocabulary" "$work/err" || fail "bad id error unclear: $(cat "$work/err")"
if "$bin" inspect "$work/nonexistent" 2>"$work/err"; then fail "inspect of a missing dir succeeded"; fi
echo "swarm-model cli: ok"
