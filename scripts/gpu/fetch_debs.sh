#!/usr/bin/env bash
# Run HERE (a machine with internet): downloads the Ubuntu 24.04 (noble) .debs that the GPU
# machine lacks — gRPC C++, liburing, prometheus-cpp, PCRE2, SQLite, nlohmann-json, CLI11, libsystemd's
# headers, SentencePiece and their
# libraries, Snappy and zstd's headers (the Parquet and Arrow readers), gloo's headers (CPU and cross-host process groups) — into .debs/ (git-ignored), for scripts/gpu/build_and_test.sh to unpack there.
# The GPU machine already has protobuf, yaml-cpp, GoogleTest, Boost, OpenSSL, zlib, CUDA, torch.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$here/.debs"
work="${TMPDIR:-/tmp}/offloadd-noble-apt"

packages=(
  libgrpc++-dev libgrpc++1.51t64 libgrpc-dev libgrpc29t64 protobuf-compiler-grpc libprotoc32t64
  libabsl-dev libabsl20220623t64 libre2-dev libre2-10 libc-ares-dev libcares2
  liburing-dev liburing2
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  civetweb libcivetweb-dev libcivetweb1 libcurl4-openssl-dev libcurl4t64
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libsqlite3-dev libsqlite3-0 nlohmann-json3-dev libicu-dev libicu74
  libcli11-dev
  libsystemd-dev libsystemd0 libsentencepiece-dev libsentencepiece0
  libsnappy-dev libsnappy1v5 libzstd-dev libzstd1
  libgloo-dev
)

mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$out"
touch "$work/status"
cat >"$work/sources.list" <<LIST
deb [trusted=yes] http://archive.ubuntu.com/ubuntu noble main universe
deb [trusted=yes] http://archive.ubuntu.com/ubuntu noble-updates main universe
LIST
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::State::Status=$work/status"
          -o "Dir::Cache=$work/cache" -o APT::Architecture=amd64 -o APT::Architectures=amd64
          -o Acquire::Languages=none -o Acquire::AllowInsecureRepositories=true)
apt-get "${apt_opts[@]}" update -qq 2>/dev/null || { echo "apt-get update against archive.ubuntu.com failed" >&2; exit 1; }
rm -f "$out"/*.deb
(cd "$out" && apt-get "${apt_opts[@]}" download "${packages[@]}" 2>&1 | grep -v "^Get:" || true)
n=$(ls "$out"/*.deb 2>/dev/null | wc -l)
[[ $n -eq ${#packages[@]} ]] || { echo "expected ${#packages[@]} .debs, got $n" >&2; exit 1; }
echo "fetched $n packages ($(du -sh "$out" | cut -f1)) into $out"
