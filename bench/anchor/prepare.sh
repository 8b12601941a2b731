#!/usr/bin/env bash
# Extracts llama.cpp's public headers (include/, ggml/include/) from the source bundle that
# node-llama-cpp ships (node_modules/node-llama-cpp/llama/gitRelease.bundle) into OUT_DIR, so
# bench_anchor compiles against exactly the version of the prebuilt libllama/libggml next to
# it. Idempotent: OUT_DIR/bundle-commit records the bundle's commit and a second run with the
# same bundle does nothing. Nothing is downloaded. CMake runs it at configure time.
#
#   bench/anchor/prepare.sh OUT_DIR     (e.g. build/bench/anchor/llama-cpp)
set -euo pipefail

out="${1:?usage: prepare.sh OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle="$here/node_modules/node-llama-cpp/llama/gitRelease.bundle"
if [ ! -f "$bundle" ]; then
  echo "prepare.sh: $bundle not found: run 'npm ci --prefix bench/anchor --omit=optional --ignore-scripts'" >&2
  exit 1
fi

commit="$(git bundle list-heads "$bundle" | awk '$2 == "HEAD" { print $1; exit }')"
if [ -z "$commit" ]; then
  echo "prepare.sh: $bundle has no HEAD" >&2
  exit 1
fi
if [ -f "$out/bundle-commit" ] && [ "$(cat "$out/bundle-commit")" = "$commit" ] && [ -f "$out/include/llama.h" ]; then
  exit 0
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
git init --quiet --bare "$scratch/repo"
git -C "$scratch/repo" fetch --quiet "$bundle" HEAD
rm -rf "$out"
mkdir -p "$out"
git -C "$scratch/repo" archive FETCH_HEAD include ggml/include | tar -x -C "$out"
echo "$commit" >"$out/bundle-commit"
echo "prepare.sh: llama.cpp headers of $commit in $out"
