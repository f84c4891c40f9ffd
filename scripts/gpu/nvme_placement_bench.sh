#!/usr/bin/env bash
# Run ON THE GPU MACHINE (the 125 GiB host, 64 GiB disk), from the repository root, .debs carried:
# part of the optimizer states on NVMe, per block (job/state_placement.h). Measures the store
# directory's rate (offloadd-storage-bench, O_DIRECT io_uring, queue depths 8/32/64), then
#   1. the Llama-3-8B shape at batch 16 in 24 GiB, --tier=nvme under --host-memory-limit=LIMIT8
#      (default 112GiB: most blocks' states in RAM, the rest on NVMe);
#   2. the largest llama3-<N>l shape (Llama-3-8B with N layers) that --validate-only accepts
#      under the default host limit (what the node can give: MemAvailable less the reserve) and
#      the disk's free space, and runs it. The planner admits 43 layers (10.4 B parameters) on the
#      idle host with 62.9 GiB free (StatePlacementTest.LargestLlamaShapesOnTheH200Host).
# OUT receives the JSON of each run and storage.txt.
#   OFFLOADD_BUILD_DIR=/tmp/b scripts/gpu/nvme_placement_bench.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${OFFLOADD_BUILD_DIR:-$PWD/build-gpu}"
export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT="${OUT:-/tmp}"
store="${STORE_DIR:-/var/tmp/offloadd-nvme}"
t0=$(date +%s)
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store offloadd-workers-bench offloadd-storage-bench" \
  scripts/gpu/build_and_test.sh -R '^$' > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
free -g | head -2
mkdir -p "$store"
df -B1 --output=avail,size "$store" | tail -1 | awk '{printf "disk: %.1f GiB free of %.1f GiB\n", $1/2^30, $2/2^30}'
best_r=0 best_w=0
for qd in ${QDS:-8 32 64}; do
  rm -rf "$store/bench"
  "$build/bench/storage/offloadd-storage-bench" --dir="$store/bench" --size="${BENCH_SIZE:-4GiB}" \
    --tensor-size=256MiB --queue-depth="$qd" --phases=write,read > /tmp/sb.txt 2>&1
  echo "queue depth $qd: $(grep -E '^phase=' /tmp/sb.txt | tr '\n' ' ')" | tee -a "$OUT/storage.txt"
  w=$(awk -F'gbps=' '/^phase=write/ {print $2+0}' /tmp/sb.txt)
  r=$(awk -F'gbps=' '/^phase=read/ {print $2+0}' /tmp/sb.txt)
  if awk "BEGIN {exit !($r + $w > $best_r + $best_w)}"; then best_r=$r best_w=$w; fi
done
rm -rf "$store/bench"
echo "disk rate: read $best_r GB/s, write $best_w GB/s (best queue depth)"
summary() {
  python3 - "$1" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
r = d[0] if isinstance(d, list) else d
print({k: r.get(k) for k in ("batch", "tokens_per_second", "step_seconds", "gpu_compute_seconds", "cpu_update_seconds",
                             "nvme_seconds", "nvme_read_bytes", "nvme_write_bytes", "nvme_bound_seconds",
                             "bound_by", "bound_seconds", "step_over_bound", "step_over_held_bound",
                             "host_peak_gib", "arena_gib", "gpu_peak_gib", "time_to_first_step_seconds", "error")})
print([(x["step"], round(x["step_seconds"], 2), x["bound_by"], round(x["step_over_bound"], 2)) for x in r.get("per_step", [])])
PY
}
bench() {  # timeout, shape, json, more run_bench flags
  local limit=$1 shape=$2 json=$3
  shift 3
  rm -rf "$store/states"
  timeout "$limit" python3 bench/pipeline/run_bench.py --build "$build" --shape "$shape" --batch 16 \
    --gpu-memory-limit 24GiB --steps "${STEPS:-2}" --warmup "${WARMUP:-1}" --max-grad-norm 1.0 --speculate default \
    --tier nvme --nvme-dir "$store/states" --nvme-gbps "$best_r,$best_w" "$@" --json "$json" 2>&1 \
    | grep -E "^\| (llama|shape|---)|step/bound per step|calibration:|rror|plan:|Killed|host memory:|^\\$"
  summary "$json"
}
if [[ -n "${LIMIT8-112GiB}" ]]; then
  bench "${TIMEOUT8:-300}" llama3-8b "$OUT/llama3-8b.json" "--train-args=--host-memory-limit=${LIMIT8:-112GiB}"
fi
# The largest shape the default limit and the disk accept.
for n in ${LAYERS:-45 44 43 42 40 38 36 34}; do
  shape="llama3-${n}l"
  dir=$(mktemp -d)
  python3 -c "import sys; sys.path.insert(0, 'bench/pipeline'); from run_bench import write_config; import pathlib; write_config('$shape', pathlib.Path('$dir'))"
  rm -rf "$store/states"
  if "$build/trainer/offloadd-train" --model="$dir" --random-init --synthetic-seq=1024 --batch-size=16 \
      --device=cuda --dtype=bf16 --gpu-memory-limit=24GiB --workers=1x15 --max-grad-norm=1.0 \
      --tier=nvme --nvme-dir="$store/states" --validate-only > /tmp/v.txt 2>&1; then
    echo "largest accepted: $shape"; grep -E "host memory|optimizer states in|per tier" /tmp/v.txt | cut -c1-600
    bench "${TIMEOUT_LARGEST:-300}" "$shape" "$OUT/$shape.json"
    break
  fi
  echo "$shape refused: $(grep -iE 'refus|need|error' /tmp/v.txt | tail -1 | cut -c1-400)"
done
rm -rf "$store/states"
exit 0
