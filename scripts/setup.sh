#!/usr/bin/env bash
# Installs every Debian package swarm needs. Idempotent: quiet when everything is there.
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail

# The Node packages of the tests, pinned by their package-lock.json files, installed once npm
# is there (when this script exits successfully): tests/js (the reference tokenizer, the agent
# frameworks and SDKs) and tests/harness (Claude Code, the Claude Agent SDK and Codex, ~1 GB of
# native binaries; SWARM_SKIP_HARNESSES=1 leaves them out and their tests skip), and on
# x86-64 Linux bench/anchor (llama.cpp from node-llama-cpp for bench_anchor, ~85 MB;
# SWARM_SKIP_ANCHOR=1 leaves it out and bench_anchor builds without the llama.cpp side).
install_js_reference() {
  local root dir
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests"
  command -v npm >/dev/null 2>&1 || return 0
  for dir in "$root/js" "$root/harness"; do
    [ "$dir" = "$root/harness" ] && [ "${SWARM_SKIP_HARNESSES:-0}" = 1 ] && continue
    # Also when package-lock.json changed since the last install (npm writes
    # node_modules/.package-lock.json at each), so existing checkouts get new packages.
    if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
      npm ci --prefix "$dir" --silent --no-audit --no-fund
    fi
  done
  # llama.cpp for bench_anchor (bench/anchor/package.json): node-llama-cpp's prebuilt linux-x64
  # CPU libraries and its llama.cpp source bundle. --omit=optional leaves out its CUDA/Vulkan
  # builds (the CPU package is a direct dependency); --ignore-scripts skips its postinstall,
  # which would probe the binaries and could fetch and build llama.cpp. Nothing runs at run time.
  dir="$root/../bench/anchor"
  if [ "${SWARM_SKIP_ANCHOR:-0}" != 1 ] && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
    if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
      npm ci --prefix "$dir" --silent --no-audit --no-fund --omit=optional --ignore-scripts
    fi
  fi
}
trap 'status=$?; if [ "$status" -eq 0 ]; then install_js_reference || status=$?; fi; exit "$status"' EXIT

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # server / client / mock (no torch)
  libboost1.81-dev nlohmann-json3-dev libyaml-cpp-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libcli11-dev libpcre2-dev
  # torch backend (inference + trainer); gloo for c10d on CPU; OpenBLAS for fast fp32 matmul
  libtorch-dev libgloo-dev libopenblas0-pthread
  # python references for parity tests (run with /usr/bin/python3)
  python3-torch python3-numpy python3-jinja2
  # AgentJet conformance test: PyYAML dumps the config as its client does; jsonschema checks answers
  python3-yaml python3-jsonschema python3-rfc3987
  # tools used by tests and benchmarks
  nodejs npm tmux procps curl sqlite3
  # the swarm exchange (SAPO experience sharing): the NATS broker and its C client
  nats-server libnats-dev
  # the episode store (finished episodes survive a crash): SQLite
  libsqlite3-dev
  # TLS for the HTTP server and the client SDK (--tls-cert / --tls-key); openssl makes test certificates
  libssl-dev openssl
  # swarm-plot writes its PNG charts with libpng
  libpng-dev
  # libFuzzer targets (tests/fuzz): clang >= 15, whose std::source_location works with libstdc++ 12
  clang-16 libclang-rt-16-dev
  # scripts/lint.sh: the format check (.clang-format, Debian's clang-format 14) and clang-tidy
  # (.clang-tidy; version 16 for the same reason as clang-16 above)
  clang-format clang-tidy-16
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# nodejs from another source (e.g. a preinstalled Node 20) satisfies the node/npm need.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do
    [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p")
  done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
