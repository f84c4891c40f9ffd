#!/usr/bin/env bash
# Run HERE: builds a static fio (io_uring engine, no optional libraries) from Debian's source
# package into .gpu-tools/fio, for bench/storage/run_bench.py on the GPU machine, which has no fio
# and no registry access (Ubuntu's fio package drags in Ceph and RDMA libraries).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${TMPDIR:-/tmp}/offloadd-fio-src"
mkdir -p "$work/lists/partial" "$here/.gpu-tools"
echo "deb-src [trusted=yes] http://deb.debian.org/debian bookworm main" >"$work/sources.list"
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$work/lists")
apt-get "${opts[@]}" update -qq
(cd "$work" && apt-get "${opts[@]}" source --download-only fio >/dev/null 2>&1)
src="$(ls -d "$work"/fio_*.orig.tar.* | head -1)"
rm -rf "$work/build" && mkdir -p "$work/build" && tar xf "$src" -C "$work/build" --strip-components=1
cd "$work/build"
./configure --build-static --disable-native --disable-gfapi --disable-rdma --disable-rados --disable-rbd \
  --disable-http --disable-pmem >/dev/null
make -j"$(nproc)" fio >/dev/null
strip -o "$here/.gpu-tools/fio" fio
"$here/.gpu-tools/fio" --enghelp | grep -q io_uring || { echo "fio built without io_uring" >&2; exit 1; }
echo "built $here/.gpu-tools/fio ($("$here/.gpu-tools/fio" --version))"
