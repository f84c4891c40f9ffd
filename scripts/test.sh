#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), builds everything, runs every
# suite (GoogleTest + pytest through CTest). GPU tests skip when there is no GPU.
#   OFFLOADD_BUILD_DIR   build directory (default: build)
#   OFFLOADD_CMAKE_ARGS  extra CMake arguments, e.g. -DOFFLOADD_CUDA=OFF
#   OFFLOADD_FUZZ_SECONDS  seconds each fuzz harness runs after the tests (default 20; the
#                        regression inputs in fuzz/regressions/ are replayed first)
#   OFFLOADD_SKIP_FUZZ=1 skip the fuzz step (said loudly; for quick local runs only, CI must not)
#   OFFLOADD_SKIP_SANITIZERS=1  skips the sanitizer step (scripts/sanitize.sh: ASan+UBSan and TSan
#                        builds of the torch-free suites, bounded by OFFLOADD_SANITIZE_TIMEOUT)
#   extra arguments are passed to ctest (e.g. -R daemon, -L gpu)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OFFLOADD_BUILD_DIR:-$here/build}"
jobs="$(nproc)"

"$here/scripts/setup.sh"
# ccache hits across clones in other directories (CI builds a fresh clone each time): paths under
# the checkout are hashed relative to it, and the working directory is left out of the hash.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$here}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
# shellcheck disable=SC2086
cmake -S "$here" -B "$build" -G Ninja ${OFFLOADD_CMAKE_ARGS:-} >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log" >&2; echo "[test] CMake configure failed" >&2; exit 1; }
cmake --build "$build" -j "$jobs"
# Which CPU AdamW kernel flavours this machine runs (the parity tests run each; the others skip).
echo "[test] AdamW kernel flavours on this CPU (fastest first): $("$build/workers/offloadd-optim-tool" paths)" \
  "${OFFLOADD_ADAMW_KERNEL:+(OFFLOADD_ADAMW_KERNEL=$OFFLOADD_ADAMW_KERNEL)}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"

# Fuzzing (fuzz/, scripts/fuzz.sh): clang build with ASan+UBSan in build-fuzz, replay of every
# regression input, then a bounded run of each harness on seeds from ../shared/data. Any crash,
# leak, timeout or sanitizer report fails the run.
if [[ "${OFFLOADD_SKIP_FUZZ:-0}" == 1 ]]; then
  echo "[test] WARNING: fuzz step SKIPPED because OFFLOADD_SKIP_FUZZ=1 (harnesses not built, regression inputs not replayed)" >&2
else
  OFFLOADD_FUZZ_KEEP_CORPUS=0 "$here/scripts/fuzz.sh" "${OFFLOADD_FUZZ_SECONDS:-20}"
fi

# A separate, bounded step: the torch-free C++ suites under ASan+UBSan, the concurrency-heavy ones
# under TSan, each in its own build directory (build-asan, build-tsan). Skipped only on request.
if [[ "${OFFLOADD_SKIP_SANITIZERS:-0}" == 1 ]]; then
  echo "[test] sanitizer step skipped: OFFLOADD_SKIP_SANITIZERS=1"
else
  sanitize_start=$SECONDS
  OFFLOADD_SANITIZE_BUILD_PREFIX="$build" "$here/scripts/sanitize.sh"
  echo "[test] sanitizer step passed in $((SECONDS - sanitize_start)) s"
fi
