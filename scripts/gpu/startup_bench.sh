#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, .debs carried.
#   scripts/gpu/startup_bench.sh build              # offloadd-train, -worker, -store (CUDA)
#   scripts/gpu/startup_bench.sh startup [RUNS]     # 7B checkpoint on local disk: time to first step
#     (RUNS: name:flags,...; default overlap:,previous:--no-setup-overlap,serial:--setup-threads=1)
#   scripts/gpu/startup_bench.sh speculation        # 7B b16 24 GiB: the default policy vs holding
#   scripts/gpu/startup_bench.sh clip DATA_DIR      # 1.1B on Alpaca: clip rate, default vs never
# OFFLOADD_BUILD_DIR (default build-gpu) is the build; OUT receives JSON.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${OFFLOADD_BUILD_DIR:-build-gpu}"
export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT="${OUT:-/tmp}"
case "${1:-}" in
  build)
    t0=$(date +%s)
    OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store" \
      scripts/gpu/build_and_test.sh -R '^$' > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
    head -2 /tmp/b.log
    echo "build: $(( $(date +%s) - t0 )) s"
    ;;
  startup)
    timeout "${RUN_TIMEOUT:-420}" python3 bench/pipeline/startup_bench.py --build "$build" --cold \
      --runs "${2:-overlap:,previous:--no-setup-overlap,serial:--setup-threads=1}" ${STARTUP_ARGS:-} --json "$OUT/startup.json" 2>&1 | grep -v Warning
    ;;
  speculation)
    for s in default never; do
      timeout "${RUN_TIMEOUT:-200}" python3 bench/pipeline/run_bench.py --build "$build" --shape llama2-7b --batch 16 \
        --gpu-memory-limit 24GiB --steps "${STEPS:-3}" --warmup "${WARMUP:-3}" --max-grad-norm "${MAX_GRAD_NORM:-1.0}" \
        --speculate "$s" --no-calibrate --json "$OUT/spec-$s.json" 2>&1 \
        | grep -E "^\| (llama|shape|---)|clip rate|error|plan:"
    done
    ;;
  clip)
    timeout "${RUN_TIMEOUT:-300}" python3 bench/pipeline/clip_rate.py --device cuda --build "$build" --data-dir "$2" \
      --steps "${STEPS:-150}" --json "$OUT/clip-cuda.json" 2>&1 | grep -v Warning | tail -40
    ;;
  *) echo "usage: $0 build|startup [RUNS]|speculation|clip DATA_DIR" >&2; exit 2 ;;
esac
