#!/usr/bin/env bash
# Mixture-of-experts benchmarks. Run ON THE GPU MACHINE from the repository root with a built tree
# (CUDA flavour; nothing is built here):
#
#   BUILD=/tmp/gpu-build bench/moe/run_moe_bench.sh                     # PARTS="layer a" (one H200)
#   BUILD=/tmp/gpu-build PARTS="v b1 b4 t4" bench/moe/run_moe_bench.sh  # the x4 host (4 GPUs)
#
# Parts (PARTS; each writes $OUT_DIR/<part>.{log,json}; the summary lists every part run so far):
#   layer  one OLMoE-1B-7B and one Qwen3-30B-A3B MoE decoder layer, fwd + bwd, expert GEMMs per
#          expert vs grouped (bench/engine/moe_layer_bench.py; ~40 s)
#   a      OLMoE-1B-7B on 1 GPU, BUDGET (24GiB), automatic batch (offloadd, bench/pipeline/
#          run_bench.py), then native PyTorch: transformers' model all on the GPU (baseline_torch.py,
#          batches TORCH_OLMOE_B); needs ~100 GB of host RAM for offloadd's states (14 B/parameter)
#   v      Qwen3-30B-A3B --validate-only with --gpus=4 and --host-memory-limit=HOST_LIMIT (470GiB):
#          30.5B x 14 B = 427 GB of host states; prints the plan, runs nothing on the GPUs (~10 s)
#   b1     Qwen3-30B-A3B on 1 GPU, BUDGET, automatic batch, HOST_LIMIT
#   b4     Qwen3-30B-A3B on 4 GPUs (--gpus=4, BUDGET each, one host copy of the states), batch
#          QWEN_B per GPU x QWEN_ACCUM micro-batches (automatic batch is refused with --gpus)
#   t4     PyTorch FSDP2 on the same 4 GPUs, everything on the GPU (baseline_torch.py --parallel
#          fsdp2, batch TORCH_QWEN_B per GPU)
# Steps: offloadd WARMUP (1) + STEPS (2) optimizer steps per run, PyTorch TORCH_WARMUP (1) +
# TORCH_STEPS (3). Each run is stopped after RUN_TIMEOUT (170 s) and reported as such.
# Reported (SUMMARY, from the JSON of each run): tokens/s, GPU peak, host RAM peak, and for offloadd
# the per-step CPU update time against its bound (run_bench.py's calibration: parameters updated
# over the pool's AdamW rate alone on idle cores) and the step over its bound.
#
# Knobs (environment): BUILD (/tmp/gpu-build; TRAIN is $BUILD/trainer/offloadd-train), OUT_DIR
# (/tmp/moe-bench), PARTS ("layer a"), BUDGET (24GiB), HOST_LIMIT (470GiB), SEQ (1024), WORKERS
# (1x(cores-2)), QWEN_B (8), QWEN_ACCUM (8), TORCH_OLMOE_B (8,16), TORCH_QWEN_B (4), PEAK_TFLOPS
# (989), PYTHON (python3), QWEN_ARGS (more offloadd-train flags for v, b1 and b4, e.g. a compact
# optimizer mode), DRY_RUN=1 (print the commands only).
# Host RAM (--validate-only on the CPU device, 2026-11-28): Qwen3-30B-A3B on one rank needs an
# arena of 398.3 GiB (14 B/parameter; accepted under 470GiB); with --gpus=4 the arena is 512.2 GiB
# (18 B/parameter: the ranks' gradient shards land in it too), more than a 503 GiB host holds, so
# b4 is refused unless QWEN_ARGS makes the states smaller (a compact optimizer mode, where data
# parallelism accepts it). Part v gives the CUDA figure. OLMoE-1B-7B: 90.3 GiB (fits 128 GiB).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # NVLink SHARP multicast stays off
if [[ -d "$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu" ]]; then  # as scripts/gpu/pipeline_check.sh
  export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

BUILD="${BUILD:-/tmp/gpu-build}"
TRAIN="${TRAIN:-$BUILD/trainer/offloadd-train}"
OUT_DIR="${OUT_DIR:-/tmp/moe-bench}"
PARTS="${PARTS:-layer a}"
BUDGET="${BUDGET:-24GiB}"
HOST_LIMIT="${HOST_LIMIT:-470GiB}"
SEQ="${SEQ:-1024}"
NCPU="$(nproc)"
WORKERS="${WORKERS:-1x$(( NCPU > 3 ? NCPU - 2 : 1 ))}"
WARMUP="${WARMUP:-1}"
STEPS="${STEPS:-2}"
TORCH_WARMUP="${TORCH_WARMUP:-1}"
TORCH_STEPS="${TORCH_STEPS:-3}"
QWEN_B="${QWEN_B:-8}"
QWEN_ACCUM="${QWEN_ACCUM:-8}"
TORCH_OLMOE_B="${TORCH_OLMOE_B:-8,16}"
TORCH_QWEN_B="${TORCH_QWEN_B:-4}"
PEAK_TFLOPS="${PEAK_TFLOPS:-989}"
PYTHON="${PYTHON:-python3}"
QWEN_ARGS="${QWEN_ARGS:-}"
RUN_TIMEOUT="${RUN_TIMEOUT:-170}"
DRY_RUN="${DRY_RUN:-0}"
mkdir -p "$OUT_DIR"
failures=0

has_part() { [[ " $PARTS " == *" $1 "* ]]; }

# run NAME CMD...: the command under RUN_TIMEOUT, its output in $OUT_DIR/NAME.log.
run() {
  local name="$1"; shift
  echo "\$ $*" | tee "$OUT_DIR/$name.log"
  [[ "$DRY_RUN" == 1 ]] && return 0
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$RUN_TIMEOUT" "$@" >>"$OUT_DIR/$name.log" 2>&1 || rc=$?
  echo "# $name: exit $rc after $(( SECONDS - t0 )) s" | tee -a "$OUT_DIR/$name.log"
  grep -E '^\||calibration|error|refused|predicted' "$OUT_DIR/$name.log" | tail -n 12
  if [[ $rc != 0 ]]; then failures=$(( failures + 1 )); fi
}

OFFLOADD=("$PYTHON" bench/pipeline/run_bench.py --build "$BUILD" --seq "$SEQ" --warmup "$WARMUP"
          --steps "$STEPS" --gpu-memory-limit "$BUDGET" --workers "$WORKERS"
          --calibration-params $(( 1 << 26 )))
TORCH=("$PYTHON" bench/pipeline/baseline_torch.py --seq "$SEQ" --warmup "$TORCH_WARMUP"
       --steps "$TORCH_STEPS" --peak-tflops "$PEAK_TFLOPS")

if has_part layer; then
  run layer "$PYTHON" bench/engine/moe_layer_bench.py --build-dir "$BUILD" --json "$OUT_DIR/layer.json"
fi
if has_part a; then
  run a-offloadd "${OFFLOADD[@]}" --shape olmoe-1b-7b --batch auto --json "$OUT_DIR/a-offloadd.json"
  run a-torch "${TORCH[@]}" --shape olmoe-1b-7b --batch "$TORCH_OLMOE_B" --json "$OUT_DIR/a-torch.json"
fi
if has_part v; then
  model="$OUT_DIR/qwen3-30b-a3b-config"
  "$PYTHON" -c "import sys; sys.path.insert(0, 'bench/pipeline'); import pathlib, run_bench; \
run_bench.write_config('qwen3-30b-a3b', pathlib.Path('$model'), $SEQ)"
  run v "$TRAIN" --model="$model" --random-init --synthetic-seq="$SEQ" --validate-only --device=cuda \
    --dtype=bf16 --gpus=4 --batch-size="$QWEN_B" --grad-accum="$QWEN_ACCUM" \
    --gpu-memory-limit="$BUDGET" --host-memory-limit="$HOST_LIMIT" --workers="$WORKERS" $QWEN_ARGS
fi
if has_part b1; then
  run b1-offloadd "${OFFLOADD[@]}" --shape qwen3-30b-a3b --batch auto \
    --train-args="--host-memory-limit=$HOST_LIMIT $QWEN_ARGS" --json "$OUT_DIR/b1-offloadd.json"
fi
if has_part b4; then
  run b4-offloadd "${OFFLOADD[@]}" --shape qwen3-30b-a3b --batch "$QWEN_B" --grad-accum "$QWEN_ACCUM" \
    --train-args="--gpus=4 --host-memory-limit=$HOST_LIMIT $QWEN_ARGS" --json "$OUT_DIR/b4-offloadd.json"
fi
if has_part t4; then
  run t4-torch "${TORCH[@]}" --shape qwen3-30b-a3b --parallel fsdp2 --nproc 4 --batch "$TORCH_QWEN_B" \
    --json "$OUT_DIR/t4-torch.json"
fi

[[ "$DRY_RUN" == 1 ]] || "$PYTHON" bench/moe/summarize.py "$OUT_DIR"
exit $(( failures > 0 ))
