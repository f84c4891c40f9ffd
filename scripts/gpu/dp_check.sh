#!/usr/bin/env bash
# Run ON THE MULTI-GPU MACHINE (nvidia-h200-x2 / nvidia-h100-x2), from the repository root, with
# .debs carried (scripts/gpu/fetch_debs.sh): the data-parallel checks.
#   scripts/gpu/dp_check.sh build            build offloadd-train, -worker, -store into $BUILD
#   scripts/gpu/dp_check.sh exact SHAPE B    1 GPU at 2B against 2 GPUs at B each (same seed and
#                                            synthetic batches): per-step loss and grad norm
#   scripts/gpu/dp_check.sh speed SHAPE B N  N GPUs (1 or 2) at B per GPU: tokens/s
#   scripts/gpu/dp_check.sh concurrent SHAPE B  two 1-GPU runs at once, on GPU 0 and GPU 1
# Logs and stats JSONL go to $OUT_DIR (default $OUT, else /tmp/dp). NVLink multicast stays off.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-/tmp/build-gpu}"
out="${OUT_DIR:-${OUT:-/tmp/dp}}"
mkdir -p "$out" /tmp/dp-models /tmp/dp-prof
TRAIN="$BUILD/trainer/offloadd-train"
BUDGET="${BUDGET:-24GiB}"
STEPS="${STEPS:-6}"
WORKERS="${WORKERS:-1x$(( $(nproc) - 2 ))}"

model() {  # a config-only model directory of the shape (weights random-initialised by the trainer)
  python3 - "$1" <<'PY'
import sys, pathlib
sys.path.insert(0, "bench/pipeline")
from run_bench import write_config
print(write_config(sys.argv[1], pathlib.Path("/tmp/dp-models") / sys.argv[1]))
PY
}

train() {  # name, gpus-visible, extra args...
  local name="$1" visible="$2"; shift 2
  echo "== $name: CUDA_VISIBLE_DEVICES=$visible offloadd-train $*"
  CUDA_VISIBLE_DEVICES="$visible" timeout "${RUN_TIMEOUT:-420}" "$TRAIN" --device=cuda --random-init \
    --synthetic-seq=1024 --max-steps="$STEPS" --gpu-memory-limit="$BUDGET" --workers="$WORKERS" \
    --max-grad-norm=1.0 --lr=1e-5 --scheduler=constant --no-export --profile-dir=/tmp/dp-prof \
    --stats-jsonl="$out/$name.jsonl" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  grep -E "^step|data parallel|plan:|error|Error|failed" "$out/$name.log" | tail -12
  echo "== $name: exit $rc"
  return $rc
}

summary() {  # tokens/s over steps after the first 2
  python3 - "$@" <<'PY'
import json, sys
for p in sys.argv[1:]:
    rows = [json.loads(l) for l in open(p) if '"loss"' in l]
    t = rows[2:] or rows
    tok = sum(r["tokens"] for r in t) / sum(r["step_seconds"] for r in t)
    print(f"{p}: {len(rows)} steps, {tok:,.0f} tok/s, step {sum(r['step_seconds'] for r in t)/len(t):.3f} s, "
          f"gpu {sum(r['gpu_compute_seconds'] for r in t)/len(t):.3f} s, cpu {sum(r['cpu_update_seconds'] for r in t)/len(t):.3f} s, "
          f"peak {max(r['gpu_peak_bytes'] for r in rows)/2**30:.1f} GiB")
PY
}

case "${1:-}" in
  build)
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
    nvidia-smi topo -m 2>/dev/null | head -5
    NCCL_INCLUDE_DIR="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)"
    export NCCL_INCLUDE_DIR
    echo "nccl.h from ${NCCL_INCLUDE_DIR:-?}"
    OFFLOADD_BUILD_DIR="$BUILD" OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store" \
      "$here/scripts/gpu/build_and_test.sh" -R '^none$' 2>&1 | grep -vE "^\[[0-9]+/[0-9]+\] (Building|Linking)" | tail -15
    ;;
  exact)
    m="$(model "$2")"; b="$3"
    train "exact-1gpu" 0 --model="$m" --batch-size=$((2 * b)) --seed=11
    train "exact-2gpu" 0,1 --model="$m" --batch-size="$b" --seed=11 --gpus=2
    python3 - "$out/exact-1gpu.jsonl" "$out/exact-2gpu.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
for x, y in zip(a, b):
    print(f"step {x['step']}: loss {x['loss']:.6f} / {y['loss']:.6f} (rel {abs(x['loss']-y['loss'])/abs(x['loss']):.2e}), "
          f"grad_norm {x['grad_norm']:.5f} / {y['grad_norm']:.5f} (rel {abs(x['grad_norm']-y['grad_norm'])/x['grad_norm']:.2e}), "
          f"tokens {x['tokens']} / {y['tokens']}")
PY
    ;;
  speed)
    shape="$2"; m="$(model "$shape")"; b="$3"; n="$4"; shift 4
    if [[ "$n" == 1 ]]; then train "speed-$shape-b$b-1gpu" 0 --model="$m" --batch-size="$b" "$@"
    else train "speed-$shape-b$b-${n}gpu" 0,1 --model="$m" --batch-size="$b" --gpus="$n" "$@"; fi
    summary "$out/speed-$shape-b$b-${n}gpu.jsonl"
    ;;
  concurrent)
    m="$(model "$2")"; b="$3"
    train "conc-$2-b$b-solo" 0 --model="$m" --batch-size="$b"  # the same worker layout, alone
    summary "$out/conc-$2-b$b-solo.jsonl"
    train "conc-$2-b$b-gpu0" 0 --model="$m" --batch-size="$b" &
    p0=$!
    train "conc-$2-b$b-gpu1" 1 --model="$m" --batch-size="$b" &
    p1=$!
    wait $p0; wait $p1
    summary "$out/conc-$2-b$b-gpu0.jsonl" "$out/conc-$2-b$b-gpu1.jsonl"
    ;;
  *) echo "usage: $0 build | exact SHAPE B | speed SHAPE B N | concurrent SHAPE B" >&2; exit 2 ;;
esac
