#!/usr/bin/env bash
# Run ON THE GPU MACHINE (Ubuntu 24.04, CUDA 13, torch 2.11+cu130, no registry access), from the
# repository root, with .debs/ carried over (scripts/gpu/fetch_debs.sh made it):
#   1. unpacks the .debs into .gpu-prefix/ (never into /),
#   2. configures the CUDA flavour against this machine's python3/torch, builds,
#   3. runs the tests labelled gpu (or the ctest arguments given, e.g. `-L gpu -R engine`).
# Environment: OFFLOADD_BUILD_DIR (default build-gpu), OFFLOADD_GPU_TARGETS (default: all).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
prefix="$here/.gpu-prefix"
build="${OFFLOADD_BUILD_DIR:-$here/build-gpu}"
ls "$here"/.debs/*.deb >/dev/null 2>&1 || { echo "no .debs/: run scripts/gpu/fetch_debs.sh here first and carry .debs" >&2; exit 1; }

if [[ ! -f "$prefix/.unpacked" || "$here/.debs" -nt "$prefix/.unpacked" ]]; then
  rm -rf "$prefix"; mkdir -p "$prefix"
  for deb in "$here"/.debs/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  touch "$prefix/.unpacked"
fi
lib="$prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:$PATH"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"

python="$(command -v python3)"
echo "== $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
echo "== $("$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())')"
cmake -S "$here" -B "$build" -G Ninja -DOFFLOADD_CUDA=ON -DOFFLOADD_PYTHON="$python" \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake" -DCMAKE_CUDA_ARCHITECTURES=90 -DOFFLOADD_WERROR=OFF >"$build.configure.log" 2>&1 \
  || { tail -40 "$build.configure.log"; exit 1; }
grep -E "offloadd .*CUDA flavour" "$build.configure.log" || true
cmake --build "$build" -j "$(nproc)" ${OFFLOADD_GPU_TARGETS:+--target $OFFLOADD_GPU_TARGETS}
if [[ $# -eq 0 ]]; then set -- -L gpu; fi
ctest --test-dir "$build" --output-on-failure "$@"
