#!/usr/bin/env bash
# Packs the built fuzz harnesses so that another Linux x86-64 machine without clang or the
# project's libraries (the GPU machine's 16-128 cores) can fuzz for CPU-hours:
#   .fuzz-bundle/fuzz.tar.zst  (git-ignored; carried to the machine beside the checkout)
# holding build-fuzz/fuzz/*_fuzzer (debug info stripped, symbols kept), every shared library
# they load except the C runtime (glibc and libstdc++/libgcc_s, which the target has in a newer
# version), the seed corpora and the real data files the harnesses read (../shared/data's Phi-3
# and GPT-2 tokenizers). On the target, from the checkout's root:
#   scripts/fuzz_bundle.sh run SECONDS [harness ...]
# unpacks it into $OFFLOADD_FUZZ_BUILD_DIR (default /tmp/fuzz-prebuilt) and runs scripts/fuzz.sh
# there with OFFLOADD_FUZZ_PREBUILT=1, every harness at once, forking OFFLOADD_FUZZ_FORK (default:
# the cores divided among the harnesses) processes each.
#
#   scripts/fuzz_bundle.sh pack      (here, after scripts/fuzz.sh has built build-fuzz/)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="$here/.fuzz-bundle/fuzz.tar.zst"
die() { echo "fuzz_bundle: $*" >&2; exit 1; }

case "${1:-}" in
  pack)
    build="${OFFLOADD_FUZZ_BUILD_DIR:-$here/build-fuzz}"
    data="${OFFLOADD_FUZZ_DATA:-$here/../shared/data}"
    compgen -G "$build/fuzz/*_fuzzer" >/dev/null || die "no harnesses in $build/fuzz (run scripts/fuzz.sh first)"
    [[ -d "$build/corpus-seed" ]] || die "no seeds in $build/corpus-seed (run scripts/fuzz.sh first)"
    stage="$(mktemp -d)"
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/fuzz" "$stage/lib" "$stage/data/tokenizers"
    for f in "$build"/fuzz/*_fuzzer; do
      objcopy --strip-debug "$f" "$stage/fuzz/$(basename "$f")"
      ldd "$f" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
          libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*|libresolv.so*) ;;
          *) [[ -f "$stage/lib/$(basename "$lib")" ]] || cp -L "$lib" "$stage/lib/" ;;
        esac
      done
    done
    cp -r "$build/corpus-seed" "$stage/corpus-seed"
    cp -r "$data/tokenizers/phi3-mini" "$data/tokenizers/gpt2" "$stage/data/tokenizers/"
    mkdir -p "$(dirname "$bundle")"
    tar -C "$stage" -cf - . | zstd -q -19 -T0 -o "$bundle" -f
    echo "fuzz_bundle: $bundle ($(du -h "$bundle" | cut -f1); $(ls "$stage/fuzz" | wc -l) harnesses, $(ls "$stage/lib" | wc -l) libraries)"
    ;;
  run)
    shift
    [[ -f "$bundle" ]] || die "$bundle not found (scripts/fuzz_bundle.sh pack, then carry .fuzz-bundle)"
    build="${OFFLOADD_FUZZ_BUILD_DIR:-/tmp/fuzz-prebuilt}"
    mkdir -p "$build"
    zstd -q -d -c "$bundle" | tar -C "$build" -xf -
    seconds="${1:?usage: scripts/fuzz_bundle.sh run SECONDS [harness ...]}"
    shift
    n=$(ls "$build"/fuzz/*_fuzzer | wc -l)
    (($# > 0)) && n=$#
    export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OFFLOADD_FUZZ_BUILD_DIR="$build" OFFLOADD_FUZZ_PREBUILT=1 OFFLOADD_FUZZ_PARALLEL=1 \
      OFFLOADD_FUZZ_DATA="$build/data" OFFLOADD_FUZZ_FORK="${OFFLOADD_FUZZ_FORK:-$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))}"
    exec "$here/scripts/fuzz.sh" "$seconds" "$@"
    ;;
  *) die "usage: scripts/fuzz_bundle.sh pack | run SECONDS [harness ...]" ;;
esac
