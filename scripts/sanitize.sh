#!/usr/bin/env bash
# Sanitizer builds of the torch-free C++ suites (cmake/Sanitize.cmake), built and run:
#   ASan+UBSan (build-asan): every GoogleTest suite that does not link LibTorch;
#   TSan       (build-tsan): the concurrency-heavy suites (job manager, worker pool, ring queue,
#                            store).
# Any sanitizer report fails the suite that produced it (halt_on_error, no UBSan recovery).
# scripts/test.sh runs this as its own bounded step after the main tests.
#   OFFLOADD_SANITIZE_MODES     which builds, in order (default: "asan tsan")
#   OFFLOADD_SANITIZE_JOBS      build and test parallelism (default: nproc)
#   OFFLOADD_SANITIZE_TIMEOUT   seconds for the whole step (default: 2400); past it the step fails
#   OFFLOADD_SANITIZE_BUILD_PREFIX  build directories are <prefix>-asan, <prefix>-tsan
#                               (default: <repo>/build)
#   extra arguments are passed to ctest (e.g. -R JobManager)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${OFFLOADD_SANITIZE_BUILD_PREFIX:-$here/build}"
jobs="${OFFLOADD_SANITIZE_JOBS:-$(nproc)}"
modes="${OFFLOADD_SANITIZE_MODES:-asan tsan}"
limit="${OFFLOADD_SANITIZE_TIMEOUT:-2400}"
supp="$here/scripts/sanitizers"
# As scripts/test.sh: ccache hits across clones (paths hashed relative to the checkout).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$here}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"

# The whole step under one bound: re-exec under timeout(1) once, killing the process group.
if [[ -z "${OFFLOADD_SANITIZE_BOUNDED:-}" ]]; then
  OFFLOADD_SANITIZE_BOUNDED=1 timeout --kill-after=30 "$limit" "$0" "$@" && exit 0
  rc=$?
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "[sanitize] FAILED: over OFFLOADD_SANITIZE_TIMEOUT=${limit}s" >&2
  exit $rc
fi

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"

for mode in $modes; do
  case "$mode" in
    asan) flags="address,undefined" ;;
    tsan) flags="thread" ;;
    *) echo "[sanitize] unknown mode '$mode' (asan, tsan)" >&2; exit 2 ;;
  esac
  build="$prefix-$mode"
  start=$SECONDS
  echo "[sanitize] $mode: configure and build $build (-fsanitize=$flags, -j$jobs)"
  # shellcheck disable=SC2086
  cmake -S "$here" -B "$build" -G Ninja -DOFFLOADD_SANITIZE="$flags" ${OFFLOADD_CMAKE_ARGS:-} \
    >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; echo "[sanitize] configure failed" >&2; exit 1; }
  cmake --build "$build" -j "$jobs"
  built=$SECONDS
  echo "[sanitize] $mode: built in $((built - start)) s; running the suites"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
  echo "[sanitize] $mode: suites passed in $((SECONDS - built)) s (step total $((SECONDS - start)) s)"
done
