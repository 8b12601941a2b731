#!/usr/bin/env bash
# The code checks CI runs (scripts/test.sh calls this after the build):
#  1. format: every C++ file of the repository is as .clang-format lays it out (clang-format 14);
#  2. clang-tidy (.clang-tidy's checks, clang-tidy 16) on every source of the libraries that build
#     without libtorch, against the build's compile_commands.json; any finding fails.
# Usage: scripts/lint.sh [BUILD_DIR]   (env: JOBS; SWARM_LINT_TIMEOUT bounds the clang-tidy pass,
# default 1200 s: past it the check fails and says so)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${1:-build}"
jobs="${JOBS:-$(nproc)}"

echo "==> format (clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1))"
mapfile -t cxx < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
if ! clang-format --dry-run -Werror "${cxx[@]}" 2>/tmp/swarm-format.$$; then
  grep -E "error:" /tmp/swarm-format.$$ | sed 's/: error:.*//' | sort -u | sed 's/^/  not formatted: /'
  rm -f /tmp/swarm-format.$$
  echo "format: run clang-format -i on the files above (the root .clang-format applies)"
  exit 1
fi
rm -f /tmp/swarm-format.$$
echo "format: ${#cxx[@]} files as .clang-format lays them out"

tidy="$(command -v clang-tidy-16 || true)"
[ -n "$tidy" ] || { echo "clang-tidy-16 is missing (scripts/setup.sh installs it)"; exit 1; }
[ -f "$build_dir/compile_commands.json" ] || { echo "no $build_dir/compile_commands.json (configure first)"; exit 1; }
# The torch-free libraries: src/ except the *_torch sources and the torch-only folder.
mapfile -t sources < <(git ls-files 'src/*.cpp' | grep -v '_torch\.cpp$' | grep -v '^src/inference/')
echo "==> clang-tidy ($("$tidy" --version | grep -o 'version [0-9.]*'), ${#sources[@]} files, $jobs at a time)"
start=$(date +%s)
log="$build_dir/clang-tidy.log"
set +e
printf '%s\n' "${sources[@]}" |
  timeout "${SWARM_LINT_TIMEOUT:-1200}" xargs -P "$jobs" -n 4 "$tidy" -p "$build_dir" --quiet >"$log" 2>&1
rc=$?
set -e
if [ $rc -eq 124 ]; then
  echo "clang-tidy: did not finish within ${SWARM_LINT_TIMEOUT:-1200} s"
  exit 1
fi
findings=$(grep -cE '(warning|error): ' "$log" || true)
if [ $rc -ne 0 ] || [ "$findings" -ne 0 ]; then
  grep -E '(warning|error): ' "$log" | sort -u | head -200
  echo "clang-tidy: $findings finding(s) (full output: $log)"
  exit 1
fi
echo "clang-tidy: clean ($(($(date +%s) - start)) s)"
