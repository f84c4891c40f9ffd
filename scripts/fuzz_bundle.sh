#!/usr/bin/env bash
# Packs the built fuzz harnesses so that another Linux x86-64 machine without clang or the
# project's libraries (the GPU machine's 16-128 cores) can fuzz for CPU-hours:
#   .fuzz-bundle/fuzz.tar.xz  (git-ignored; carried to the machine with the checkout; xz -9e: about
#   26 MB, so that it fits the GPU machine's 64 MiB carry limit beside the checkout, not with .debs)
# holding build-fuzz/fuzz/*_fuzzer (debug info stripped, symbols kept), every shared library
# they load except the C runtime (glibc and libstdc++/libgcc_s, which the target has in a newer
# version), the seed corpora and the real data files the harnesses read (../shared/data's Phi-3
# and GPT-2 tokenizers). On the target, from the checkout's root:
#   scripts/fuzz_bundle.sh run SECONDS [harness ...]
# unpacks it into $OFFLOADD_FUZZ_BUILD_DIR (default /tmp/fuzz-prebuilt; without the bundle, what an
# earlier run unpacked there is used) and runs scripts/fuzz.sh
# there with OFFLOADD_FUZZ_PREBUILT=1, every harness at once, forking OFFLOADD_FUZZ_FORK (default:
# the cores divided among the harnesses) processes each.
#
#   scripts/fuzz_bundle.sh pack      (here, after scripts/fuzz.sh has built build-fuzz/)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="$here/.fuzz-bundle/fuzz.tar.xz"
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
    tar -C "$stage" -cf - . | xz -9e -T0 >"$bundle"
    echo "fuzz_bundle: $bundle ($(du -h "$bundle" | cut -f1); $(ls "$stage/fuzz" | wc -l) harnesses, $(ls "$stage/lib" | wc -l) libraries)"
    ;;
  run)
    shift
    build="${OFFLOADD_FUZZ_BUILD_DIR:-/tmp/fuzz-prebuilt}"
    if [[ -f "$bundle" ]]; then
      mkdir -p "$build"
      xz -d -c -T0 "$bundle" | tar -C "$build" -xf -
    else  # unpacked by an earlier run on this machine (its corpus-found/ is kept and extended)
      compgen -G "$build/fuzz/*_fuzzer" >/dev/null \
        || die "$bundle not found and nothing unpacked in $build (scripts/fuzz_bundle.sh pack, then carry .fuzz-bundle)"
    fi
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
