#!/usr/bin/env bash
# examples/harness_agent end to end: Claude Code and Codex (tests/harness) each run
# the file task on claimed episodes. On the mock engine (--scripted, greedy) every episode must
# write the right answer.txt (reward 1) and the engine must train; on the torch engine (a random
# tiny Qwen3 with Qwen3's template) Claude Code runs one policy step: a random model does not
# solve the task, so only the plumbing is checked (episodes end, the engine trains).
# Usage: harness_agent_smoke.sh <swarm-server> <harness_agent> <source dir> [<swarm-model>]
# Exits 77 (skip) when the harnesses are not installed (scripts/setup.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$1" agent_bin="$2" source_dir="$3" model_bin="${4:-}"
for h in claude codex; do
  [ -e "$source_dir/tests/harness/node_modules/.bin/$h" ] || { echo "skip: $h not installed (scripts/setup.sh)"; exit 77; }
done
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

engine=mock model=mock
if [ -n "$model_bin" ]; then
  engine=torch
  mkdir src
  cp "$source_dir/tests/data/tiny-qwen3/config.json" "$source_dir/tests/data/tiny-qwen3/generation_config.json" src/
  cp "$source_dir/tests/fixtures/tokenizers/qwen3/tokenizer.json" "$source_dir/tests/fixtures/tokenizers/qwen3/tokenizer_config.json" src/
  "$model_bin" init --from src --out model --dtype f32 --seed 1 >/dev/null || fail "swarm-model init"
  model="$work/model"
fi
"$server_bin" start --port 0 --engine "$engine" --log-level info >server.log 2>&1 &
pid=$!
wait_for_port server.log "$pid" 600 0.1 || fail "$server_problem"
if [ "$engine" = mock ]; then
  for h in claude codex; do
    "$agent_bin" --url "http://127.0.0.1:$port" --model mock --harness "$h" --scripted --temperature 0 --steps 1 \
      --force-restart >"agent-$h.log" 2>&1 || { cat "agent-$h.log" >&2; fail "harness_agent --harness $h failed"; }
    cat "agent-$h.log"
    grep -q '^step 1/1 .* reward=1.000  answer_file=1.00  correct=1.00  harness_failed=0.00' "agent-$h.log" ||
      fail "$h: every episode must write the right answer.txt"
  done
  echo "ok: harness_agent ran Claude Code and Codex on the mock engine"
else
  "$agent_bin" --url "http://127.0.0.1:$port" --model "$model" --harness claude --steps 1 --batch-size 1 --num-repeat 2 \
    --max-tokens 32 --max-prompt-length 1900 --episode-timeout 120 >agent.log 2>&1 || { cat agent.log >&2; fail "harness_agent failed"; }
  cat agent.log
  grep -q "^step 1/1  global_step=1 " agent.log || fail "the engine did not train"
  echo "ok: harness_agent ran Claude Code on the torch engine"
fi
