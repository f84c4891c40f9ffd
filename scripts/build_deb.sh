#!/usr/bin/env bash
# Builds the Debian package from debian/ with dpkg-buildpackage, on an already built tree:
#   build_deb.sh BUILD_DIR OUT_DIR
# debian/ is copied into OUT_DIR/src and built there (debian/rules with OFFLOADD_BUILD_DIR), so
# nothing is written into the checkout; the .deb, .buildinfo and .changes land in OUT_DIR and the staging tree is removed (it is as large as the installed package).
# Prints the .deb's path. OFFLOADD_JOBS: parallel jobs (default: all cores). scripts/package.sh and
# tests/python/packaging call it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# == 2 ]] || { echo "usage: $0 BUILD_DIR OUT_DIR" >&2; exit 2; }
build="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
[[ -f "$build/CMakeCache.txt" ]] || { echo "[deb] $build is not a configured build tree" >&2; exit 1; }
python="$(sed -n 's/^OFFLOADD_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")"

rm -rf "$out/src" "$out"/offloadd_*.deb "$out"/offloadd_*.changes "$out"/offloadd_*.buildinfo
mkdir -p "$out/src"
cp -r "$here/debian" "$out/src/"
# -b: binary only; -us -uc: unsigned; -d: LibTorch, found through OFFLOADD_PYTHON, is no
# Build-Depends, and the tree was built with what scripts/setup.sh installed.
(cd "$out/src" && OFFLOADD_BUILD_DIR="$build" OFFLOADD_PYTHON="$python" \
   dpkg-buildpackage -b -us -uc -d -j"${OFFLOADD_JOBS:-$(nproc)}" >"$out/build.log" 2>&1) \
  || { tail -40 "$out/build.log" >&2; echo "[deb] dpkg-buildpackage failed (log: $out/build.log)" >&2; exit 1; }
rm -rf "$out/src"
ls "$out"/offloadd_*.deb
