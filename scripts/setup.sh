#!/usr/bin/env bash
# Installs everything offloadd needs on a fresh Debian 12 / Ubuntu 24.04 machine:
#   1. Debian packages (compiler, build tools, gRPC, protobuf, Boost, liburing, prometheus-cpp,
#      yaml-cpp, GoogleTest, SQLite, PCRE2, Prometheus/promtool, CBC, fio, clang-format; clang 16
#      with its libFuzzer/sanitizer runtimes for the fuzz harnesses, scripts/fuzz.sh);
#   2. a Python virtualenv with LibTorch (PyPI's torch wheel, pinned) and the SDK/test packages.
# Idempotent: each step checks first and is skipped when already satisfied. The virtualenv is
# reused as long as python-requirements.txt and the interpreter are unchanged.
#
# Environment:
#   OFFLOADD_VENV   virtualenv location (default: ~/.cache/offloadd/venv)
#   OFFLOADD_SKIP_APT=1  do not touch system packages (e.g. on a machine you do not administer)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OFFLOADD_VENV:-${HOME}/.cache/offloadd/venv}"

step() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] FAILED:\033[0m %s\n' "$*" >&2; exit 1; }

apt_packages=(
  build-essential g++ cmake ninja-build ccache pkg-config git curl ca-certificates dpkg-dev debootstrap
  debhelper help2man lintian  # the Debian package: debian/ (scripts/package.sh, tests/python/packaging)
  python3 python3-venv python3-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev liburing-dev prometheus-cpp-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libsqlite3-dev libpcre2-dev libicu-dev libssl-dev zlib1g-dev nlohmann-json3-dev
  prometheus coinor-libcbc-dev fio
  libgloo-dev  # c10d ProcessGroupGloo headers: CPU data-parallel executors (trainer/pipeline/data_parallel.cc)
  libsystemd-dev  # sd_notify / sd_watchdog_enabled (daemon/systemd/sd_notify.cc)
  libsentencepiece-dev  # tokenizer.model files (text/sentencepiece_shim.cc)
  libsnappy-dev libzstd-dev  # Parquet page codecs (text/parquet_reader.cc)
  clang-16 libclang-rt-16-dev llvm-16  # libFuzzer, ASan/UBSan, llvm-symbolizer for fuzz/ (scripts/fuzz.sh)
  clang-format  # clang-format-diff: the changed-lines format check (scripts/check_format.sh)
)

install_apt() {
  if [[ "${OFFLOADD_SKIP_APT:-0}" == 1 ]]; then
    step "OFFLOADD_SKIP_APT=1: not checking system packages"
    return
  fi
  command -v dpkg-query >/dev/null || die "this script needs a Debian/Ubuntu system (dpkg-query not found)"
  local missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    step "system packages: all ${#apt_packages[@]} present"
    return
  fi
  step "installing system packages: ${missing[*]}"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and sudo is missing; install as root: apt-get install ${missing[*]}"
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq || die "apt-get update failed (is the package mirror reachable?)"
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
}

install_venv() {
  local py
  py="$(command -v python3)" || die "python3 not found"
  local stamp_want
  stamp_want="$("$py" -c 'import sys; print(sys.version)' | head -1)|$(sha256sum "$here/python-requirements.txt" | cut -d' ' -f1)"
  if [[ -f "$venv/.offloadd-stamp" && "$(cat "$venv/.offloadd-stamp")" == "$stamp_want" ]]; then
    step "python virtualenv up to date: $venv"
    return
  fi
  step "creating python virtualenv in $venv (torch 2.11.0 is a large download)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv" || die "python3 -m venv failed (install python3-venv)"
  "$venv/bin/pip" install -q --upgrade pip || die "pip upgrade failed (is PyPI reachable?)"
  "$venv/bin/pip" install -q -r "$here/python-requirements.txt" \
    || die "pip install -r python-requirements.txt failed (is PyPI reachable? enough disk in $(dirname "$venv")?)"
  "$venv/bin/python" -c 'import torch, grpc, transformers' || die "the virtualenv does not import torch/grpc/transformers"
  echo "$stamp_want" >"$venv/.offloadd-stamp"
}

install_apt
install_venv
step "done: LibTorch at $("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
