#!/usr/bin/env bash
# Builds the Debian package: installs what is missing (scripts/setup.sh), configures and builds
# what the package holds (target offloadd_installables: no tests), then builds the package from
# debian/ with debhelper (scripts/build_deb.sh). Prints the path of
# build/package/offloadd_<version>_<arch>.deb; `lintian build/package/offloadd_*.deb` checks it.
# The flavour is the build's: CUDA when nvcc and a CUDA LibTorch are present (LibTorch and the
# CUDA libraries it needs are bundled, about 2 GB), CPU otherwise (-DOFFLOADD_CUDA=OFF in
# OFFLOADD_CMAKE_ARGS).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OFFLOADD_BUILD_DIR:-$here/build}"

"$here/scripts/setup.sh"
# shellcheck disable=SC2086
cmake -S "$here" -B "$build" -G Ninja ${OFFLOADD_CMAKE_ARGS:-} >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log" >&2; echo "[package] CMake configure failed" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target offloadd_installables
"$here/scripts/build_deb.sh" "$build" "$build/package"
