#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang, ASan+UBSan) in their own build directory, replays
# the committed regression inputs (fuzz/regressions/<harness>/) and fuzzes each harness for the
# given time, starting from seeds cut from ../shared/data (fuzz/make_corpus.py). Prints per
# harness: executions, CPU seconds, new corpus entries and crashes; exits 1 on any crash or
# failed replay (the input is saved under $build/artifacts/<harness>/, with the command to rerun
# it).
#
#   scripts/fuzz.sh [seconds-per-harness] [harness ...]     (default: 300 s, every harness)
#
# Environment:
#   OFFLOADD_FUZZ_BUILD_DIR  build directory (default: build-fuzz)
#   OFFLOADD_FUZZ_JOBS       parallel compile jobs (default: nproc)
#   OFFLOADD_FUZZ_DATA       the real data files (default: ../shared/data beside the checkout)
#   OFFLOADD_FUZZ_CLANG      clang version suffix (default: 16, Debian's clang-16; 14 cannot
#                            compile workers/, which needs _Float16 on x86)
#   OFFLOADD_FUZZ_KEEP_CORPUS=1  keep inputs found by earlier runs ($build/corpus-found) and start
#                            from them too (default for runs of 60 s or more; CI starts fresh)
#   OFFLOADD_FUZZ_REPLAY_ONLY=1  build and replay the regression inputs, do not fuzz
#   OFFLOADD_FUZZ_SEED       libFuzzer seed (default: 1 for runs under 60 s, as in CI; else random)
#   OFFLOADD_FUZZ_FORK=K     K fuzzing processes per harness (libFuzzer -fork=K; timeouts, OOMs
#                            and leaks still fail the run); default 1 (one process, no fork mode)
#   OFFLOADD_FUZZ_PARALLEL=1 run every harness at once (with FORK, harnesses x K processes)
#   OFFLOADD_FUZZ_PREBUILT=1 use the harnesses already in $build/fuzz (built on another machine,
#                            scripts/fuzz_bundle.sh) and the seeds in $build/corpus-seed: no clang,
#                            no build, no ../shared/data needed
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OFFLOADD_FUZZ_BUILD_DIR:-$here/build-fuzz}"
jobs="${OFFLOADD_FUZZ_JOBS:-$(nproc)}"
data="${OFFLOADD_FUZZ_DATA:-$here/../shared/data}"
seconds="${1:-300}"
shift || true
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [seconds-per-harness] [harness ...]" >&2; exit 2; }
keep="${OFFLOADD_FUZZ_KEEP_CORPUS:-$((seconds >= 60 ? 1 : 0))}"

say() { printf '\033[1m[fuzz]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[fuzz] FAILED:\033[0m %s\n' "$*" >&2; exit 1; }

if [[ "${OFFLOADD_FUZZ_PREBUILT:-0}" != 1 ]]; then
  cxx="clang++-${OFFLOADD_FUZZ_CLANG:-16}"
  cc="clang-${OFFLOADD_FUZZ_CLANG:-16}"
  command -v "$cxx" >/dev/null || die "$cxx not found (scripts/setup.sh installs clang-16 and libclang-rt-16-dev)"
  [[ -d "$data" ]] || die "$data not found: the seed corpora are cut from the real data files (set OFFLOADD_FUZZ_DATA)"
  export OFFLOADD_FUZZ_DATA="$data"

  # --- build -------------------------------------------------------------------------------------
  t0=$SECONDS
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    CC="$cc" CXX="$cxx" cmake -S "$here" -B "$build" -G Ninja -DOFFLOADD_FUZZ=ON \
      -DOFFLOADD_BUILD_TESTS=OFF -DOFFLOADD_CUDA=OFF -DOFFLOADD_WERROR=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 \
      || { cat "$build.configure.log" >&2; die "CMake configure of $build failed"; }
  fi
  cmake --build "$build" -j "$jobs" --target offloadd_fuzzers >"$build.build.log" 2>&1 \
    || { tail -50 "$build.build.log" >&2; die "building the fuzz harnesses failed (log: $build.build.log)"; }
  say "built in $((SECONDS - t0)) s ($build)"
else
  [[ -d "$build/fuzz" && -d "$build/corpus-seed" ]] || die "OFFLOADD_FUZZ_PREBUILT=1: no $build/fuzz or $build/corpus-seed"
  export OFFLOADD_FUZZ_DATA="${OFFLOADD_FUZZ_DATA:-$build/data}" OFFLOADD_FUZZ_SOURCE_DIR="$here"
  say "prebuilt harnesses in $build/fuzz"
fi

mapfile -t all < <(cd "$here/fuzz" && ls -1 ./*_fuzzer.cc | sed 's|^\./||; s|_fuzzer\.cc$||')
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")

if [[ "${OFFLOADD_FUZZ_PREBUILT:-0}" != 1 ]]; then
  python3 "$here/fuzz/make_corpus.py" --shared "$data" --out "$build/corpus-seed" \
    || die "fuzz/make_corpus.py failed"
fi

# Bounds for every run: a single input that takes over 10 s or 2 GiB is a finding (a template
# that never stops is as much a bug as a crash), and so is a leak.
common_flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536 -print_final_stats=1)
# Short runs (CI) use a fixed seed, so that the same commit explores the same inputs first and a
# crash found in CI is found again locally; longer runs explore (OFFLOADD_FUZZ_SEED overrides).
if [[ -n "${OFFLOADD_FUZZ_SEED:-}" ]]; then
  common_flags+=("-seed=$OFFLOADD_FUZZ_SEED")
elif (( seconds < 60 )); then
  common_flags+=(-seed=1)
fi
# Symbolized stack traces in reports: the llvm-symbolizer of the same LLVM, else any.
for sym in "/usr/lib/llvm-${OFFLOADD_FUZZ_CLANG:-16}/bin/llvm-symbolizer" "$(command -v llvm-symbolizer || true)"; do
  [[ -x "$sym" ]] && { export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$sym}"; break; }
done
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

fork="${OFFLOADD_FUZZ_FORK:-1}"
[[ "$fork" =~ ^[1-9][0-9]*$ ]] || die "OFFLOADD_FUZZ_FORK must be a positive integer, got '$fork'"
fork_flags=()
# Fork mode ignores timeouts, OOMs and leaks unless told otherwise: here they are findings.
((fork > 1)) && fork_flags=(-fork="$fork" -ignore_timeouts=0 -ignore_ooms=0 -ignore_crashes=0)

# One harness: replay its regression inputs, then fuzz. Writes one report line to
# $build/reports/<h> (last word ok or FAILED) and, on a failure, the reason to $build/reports/<h>.failed.
run_harness() {
  local h="$1" bin="$build/fuzz/${1}_fuzzer"
  local art="$build/artifacts/$h" log="$build/logs/$h.log" rep="$build/reports/$h"
  mkdir -p "$art" "$build/logs" "$build/reports"
  rm -f "$rep" "$rep.failed"

  # 1. Regression inputs: every file must run clean.
  local reg="$here/fuzz/regressions/$h" nreg=0
  if [[ -d "$reg" ]] && compgen -G "$reg/*" >/dev/null; then
    nreg=$(find "$reg" -type f | wc -l)
    if ! "$bin" "${common_flags[@]}" -runs=1 "$reg"/* >"$build/logs/$h.replay.log" 2>&1; then
      tail -40 "$build/logs/$h.replay.log" >&2
      echo "$h (regression replay, log: $build/logs/$h.replay.log)" >"$rep.failed"
      printf '%-16s replay of %d regression inputs FAILED\n' "$h" "$nreg" >"$rep"
      return
    fi
  fi
  if [[ "${OFFLOADD_FUZZ_REPLAY_ONLY:-0}" == 1 || "$seconds" == 0 ]]; then
    printf '%-16s %4d regression inputs replayed clean  ok\n' "$h" "$nreg" >"$rep"
    return
  fi

  # 2. Fuzzing. New inputs go to corpus-found/<h> (kept between local runs when $keep). CPU time
  # is this subshell's children's (the fuzzer and, in fork mode, its workers).
  local found="$build/corpus-found/$h"
  [[ "$keep" == 1 ]] || rm -rf "$found"
  mkdir -p "$found"
  local before after cpu0 cpu start wall rc=0 execs me=$BASHPID  # not inside $(...): a subshell of its own
  before=$(find "$found" -type f | wc -l)
  cpu0=$(awk '{print $14+$15+$16+$17}' "/proc/$me/stat")
  start=$SECONDS
  "$bin" "${common_flags[@]}" "${fork_flags[@]}" -max_total_time="$seconds" -artifact_prefix="$art/" \
    "$found" "$build/corpus-seed/$h" >"$log" 2>&1 || rc=$?
  wall=$((SECONDS - start))
  cpu=$(awk -v t0="$cpu0" -v hz="$(getconf CLK_TCK)" '{printf "%.0f", ($14+$15+$16+$17-t0)/hz}' "/proc/$me/stat")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # Fork mode prints no final stats: its last status line ("#N: cov: ...") counts the executions.
  [[ -n "$execs" ]] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  after=$(find "$found" -type f | wc -l)
  if ((rc != 0)); then
    local crash
    crash=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | sed 's/Test unit written to //')
    echo "$h: ${crash:-exit $rc} (log: $log; rerun: $bin $crash)" >"$rep.failed"
    printf '%-16s %6s s %6s cpu-s %10s execs  CRASH %s FAILED\n' "$h" "$wall" "$cpu" "${execs:-?}" "${crash:-rc=$rc}" >"$rep"
    grep -m1 -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|fuzz invariant" "$log" >&2 || true
  else
    printf '%-16s %6s s %6s cpu-s %10s execs  %5d new inputs  %d regressions  ok\n' \
      "$h" "$wall" "$cpu" "${execs:-?}" "$((after - before))" "$nreg" >"$rep"
  fi
}

for h in "${harnesses[@]}"; do
  [[ -x "$build/fuzz/${h}_fuzzer" ]] || die "no harness '$h' (have: ${all[*]})"
done
if [[ "${OFFLOADD_FUZZ_PARALLEL:-0}" == 1 ]]; then
  say "fuzzing ${#harnesses[@]} harnesses at once, $fork process(es) each, ${seconds} s"
  for h in "${harnesses[@]}"; do run_harness "$h" & done
  wait
else
  for h in "${harnesses[@]}"; do run_harness "$h"; done
fi

failed=()
say "results (${seconds} s per harness${fork:+, $fork process(es) each}):"
total_cpu=0
for h in "${harnesses[@]}"; do
  printf '  %s\n' "$(cat "$build/reports/$h")"
  [[ -f "$build/reports/$h.failed" ]] && failed+=("$(cat "$build/reports/$h.failed")")
  c=$(awk '{for (i = 1; i < NF; i++) if ($(i + 1) == "cpu-s") print $i}' "$build/reports/$h")
  total_cpu=$((total_cpu + ${c:-0}))
done
say "CPU time: $total_cpu s ($(awk -v s="$total_cpu" 'BEGIN {printf "%.2f", s / 3600}') CPU-hours)"
if ((${#failed[@]})); then
  printf '\033[31m[fuzz] FAILED:\033[0m %s\n' "${failed[@]}" >&2
  echo "[fuzz] a crash found here becomes a regression input: minimise it (<harness> -minimize_crash=1 -runs=10000 <file>), fix the bug, and commit the input under fuzz/regressions/<harness>/" >&2
  exit 1
fi
