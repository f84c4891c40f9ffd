#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), builds everything, runs every
# suite (GoogleTest + pytest through CTest). GPU tests skip when there is no GPU.
#   OFFLOADD_BUILD_DIR   build directory (default: build)
#   OFFLOADD_CMAKE_ARGS  extra CMake arguments, e.g. -DOFFLOADD_CUDA=OFF
#   extra arguments are passed to ctest (e.g. -R daemon, -L gpu)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OFFLOADD_BUILD_DIR:-$here/build}"
jobs="$(nproc)"

"$here/scripts/setup.sh"
# shellcheck disable=SC2086
cmake -S "$here" -B "$build" -G Ninja ${OFFLOADD_CMAKE_ARGS:-} >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log" >&2; echo "[test] CMake configure failed" >&2; exit 1; }
cmake --build "$build" -j "$jobs"
# Which CPU AdamW kernel flavours this machine runs (the parity tests run each; the others skip).
echo "[test] AdamW kernel flavours on this CPU (fastest first): $("$build/workers/offloadd-optim-tool" paths)" \
  "${OFFLOADD_ADAMW_KERNEL:+(OFFLOADD_ADAMW_KERNEL=$OFFLOADD_ADAMW_KERNEL)}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
