#!/usr/bin/env bash
# Installs every Debian package swarm needs. Idempotent: quiet when everything is there.
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail

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
  # tools used by tests and benchmarks
  nodejs npm tmux procps curl
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
