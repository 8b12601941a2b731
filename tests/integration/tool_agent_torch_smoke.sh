#!/usr/bin/env bash
# examples/tool_agent on the torch engine: a randomly initialised tiny Qwen3 (tests/data/tiny-qwen3
# with Qwen3's tokenizer and chat template, which renders the calculator tool) runs STEPS policy
# steps of the multi-turn calculator loop; every step must print its line and the engine must
# train (global_step advances). A random model seldom writes a well-formed call: this is a
# smoke test, not a learning test (docs/agents.md records longer runs).
# Usage: tool_agent_torch_smoke.sh <swarm-server> <swarm-model> <tool_agent> <source dir> [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$1" model_bin="$2" agent_bin="$3" source_dir="$4" steps="${5:-2}"
work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -40 "$work/server.log" >&2 2>/dev/null || true; exit 1; }
cd "$work"

mkdir src
cp "$source_dir/tests/data/tiny-qwen3/config.json" "$source_dir/tests/data/tiny-qwen3/generation_config.json" src/
cp "$source_dir/tests/fixtures/tokenizers/qwen3/tokenizer.json" "$source_dir/tests/fixtures/tokenizers/qwen3/tokenizer_config.json" src/
"$model_bin" init --from src --out model --dtype f32 --seed 1 >/dev/null || fail "swarm-model init"

"$server_bin" start --port 0 --engine torch --log-level info >server.log 2>&1 &
pid=$!
wait_for_port server.log "$pid" 600 0.1 || fail "$server_problem"
"$agent_bin" --url "http://127.0.0.1:$port" --model "$work/model" --steps "$steps" --batch-size 2 --num-repeat 2 \
  --workers 4 --max-turns 2 --max-tokens 24 --learning-rate 1e-3 >agent.log 2>&1 || { cat agent.log >&2; fail "tool_agent failed"; }
cat agent.log
[ "$(grep -c '^step [0-9]*/'"$steps"' ' agent.log)" -eq "$steps" ] || fail "expected $steps step lines"
grep -q "global_step=$steps " agent.log || fail "the engine did not reach global_step $steps"
echo "ok: tool_agent ran $steps steps on the torch engine"
