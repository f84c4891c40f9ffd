#!/usr/bin/env bash
# Data-parallel benchmark. Run ON THE GPU MACHINE (2 GPUs) from the repository root,
# with a built offloadd-train (CUDA flavour):
#
#   TRAIN=build-gpu/trainer/offloadd-train bench/data_parallel/run_dp_bench.sh
#
# Parts (PARTS, default "a b c d e"; each part's runs are appended to $OUT_DIR/results.jsonl, and
# every call ends with the table of all results there, so the parts may run in separate calls):
#   a  solo:        1 GPU  (CUDA_VISIBLE_DEVICES=0),   batch B
#   b  dp2:         2 GPUs (--gpus=2, CUDA_VISIBLE_DEVICES=0,1), batch B per GPU
#   c  exactness:   1 GPU at batch 2B vs 2 GPUs at batch B, same seed and synthetic data, EXACT_STEPS
#                   steps: per-step loss and grad_norm compared (max relative differences)
#   d  concurrency: two independent 1-GPU runs at once, on GPU 0 and GPU 1, each against a solo run
#                   with the same worker layout (CONC_WORKERS; "conc-solo", run first on GPU 0)
#   e  PyTorch:     bench/pipeline/baseline_torch.py, 1 GPU plain (all on the GPU) and FSDP2 on 2
#                   GPUs at batch B per GPU (TORCH_PARALLEL="fsdp2" or "fsdp2 ddp"); SKIP_TORCH=1 skips
#
# Knobs (environment): TRAIN (build-gpu/trainer/offloadd-train), OUT_DIR (/tmp/dp-bench), B (4),
# STEPS (8: tokens/s is the mean of tokens/step_seconds over the steps after the first SKIP_STEPS=2),
# SHAPE (llama2-7b), SEQ (1024), BUDGET (24GiB, --gpu-memory-limit per GPU), SEED (42),
# WORKERS (1x(cores-2), for a, b, c), CONC_WORKERS (1x(cores/2-1), each run of d), SPECULATE
# (never, as bench/pipeline/run_bench.py), MAX_GRAD_NORM (1.0), PROFILE_DIR ($OUT_DIR/profile,
# node and shape profiles cached across runs), EXACT_STEPS (4), EXACT_RTOL (1e-2), GOAL (1.8),
# TRAIN_ARGS (more offloadd-train flags), DEVICE (cuda; cpu runs CPU ranks, for a smoke test),
# RUN_TIMEOUT (300 s per offloadd run), TORCH_TIMEOUT (300 s per PyTorch run), TORCH_STEPS (4),
# TORCH_WARMUP (2), TORCH_DEVICE (cuda), PEAK_TFLOPS (989), PYTHON (python3), SKIP_CONC (1: skip d;
# d is also skipped when MemAvailable is below two runs' host states, 2.2 x 16 B/parameter),
# RESET=1 (start a fresh results file), DRY_RUN=1 (print the commands, run nothing).
#
# Exit status: 0 when every run of this call succeeded (an OOM of the PyTorch baseline counts as a
# result), 1 otherwise. A failing or timed-out run is reported in the table and the next one runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # NVLink SHARP multicast stays off
if [[ -d "$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu" ]]; then  # as scripts/gpu/pipeline_check.sh
  export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

TRAIN="${TRAIN:-build-gpu/trainer/offloadd-train}"
OUT_DIR="${OUT_DIR:-/tmp/dp-bench}"
B="${B:-4}"
STEPS="${STEPS:-8}"
SKIP_STEPS="${SKIP_STEPS:-2}"
SHAPE="${SHAPE:-llama2-7b}"
SEQ="${SEQ:-1024}"
BUDGET="${BUDGET:-24GiB}"
SEED="${SEED:-42}"
NCPU="$(nproc)"
WORKERS="${WORKERS:-1x$(( NCPU > 3 ? NCPU - 2 : 1 ))}"
CONC_WORKERS="${CONC_WORKERS:-1x$(( NCPU > 3 ? NCPU / 2 - 1 : 1 ))}"
SPECULATE="${SPECULATE:-never}"
MAX_GRAD_NORM="${MAX_GRAD_NORM:-1.0}"
PROFILE_DIR="${PROFILE_DIR:-$OUT_DIR/profile}"
EXACT_STEPS="${EXACT_STEPS:-4}"
EXACT_RTOL="${EXACT_RTOL:-1e-2}"
GOAL="${GOAL:-1.8}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
DEVICE="${DEVICE:-cuda}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
TORCH_TIMEOUT="${TORCH_TIMEOUT:-300}"
TORCH_STEPS="${TORCH_STEPS:-4}"
TORCH_WARMUP="${TORCH_WARMUP:-2}"
TORCH_DEVICE="${TORCH_DEVICE:-cuda}"
TORCH_PARALLEL="${TORCH_PARALLEL:-fsdp2}"
PEAK_TFLOPS="${PEAK_TFLOPS:-989}"
PYTHON="${PYTHON:-python3}"
PARTS="${PARTS:-a b c d e}"
SKIP_TORCH="${SKIP_TORCH:-0}"
SKIP_CONC="${SKIP_CONC:-0}"
DRY_RUN="${DRY_RUN:-0}"

SUMMARIZE=("$PYTHON" bench/data_parallel/summarize.py)
RESULTS="$OUT_DIR/results.jsonl"
MODEL="$OUT_DIR/model-$SHAPE"
mkdir -p "$OUT_DIR" "$PROFILE_DIR"
[[ "${RESET:-0}" == 1 ]] && rm -f "$RESULTS"
failures=0

has_part() { [[ " $PARTS " == *" $1 "* ]]; }
say() { printf '\n== %s\n' "$*"; }

if [[ "$DRY_RUN" != 1 && ! -x "$TRAIN" ]] && { has_part a || has_part b || has_part c || has_part d; }; then
  echo "error: TRAIN=$TRAIN is not an executable offloadd-train (build it first, or set TRAIN)" >&2
  exit 2
fi

say "shape $SHAPE, seq $SEQ, batch $B per GPU, $STEPS steps (tokens/s over steps > $SKIP_STEPS), budget $BUDGET," \
  "workers $WORKERS (concurrent runs: $CONC_WORKERS each), speculate $SPECULATE, seed $SEED, device $DEVICE," \
  "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE; parts: $PARTS; results: $RESULTS"
if [[ "$DRY_RUN" == 1 ]]; then
  echo "\$ ${SUMMARIZE[*]} model-dir --shape $SHAPE --out $MODEL"
elif ! "${SUMMARIZE[@]}" model-dir --shape "$SHAPE" --out "$MODEL" >/dev/null; then
  echo "error: could not write the model directory $MODEL" >&2
  exit 2
fi

# The offloadd-train command of one run: train_cmd GPUS BATCH MAX_STEPS WORKERS STATS
train_cmd() {
  local gpus=$1 batch=$2 steps=$3 workers=$4 stats=$5
  cmd=("$TRAIN" "--model=$MODEL" --random-init "--synthetic-seq=$SEQ" "--device=$DEVICE" --dtype=bf16
       "--batch-size=$batch" "--max-steps=$steps" "--gpu-memory-limit=$BUDGET" "--max-grad-norm=$MAX_GRAD_NORM"
       --lr=1e-5 --scheduler=constant "--speculate=$SPECULATE" "--seed=$SEED" "--workers=$workers"
       "--profile-dir=$PROFILE_DIR" "--stats-jsonl=$stats" --no-export)
  if (( gpus > 1 )); then cmd+=("--gpus=$gpus"); fi
  # shellcheck disable=SC2206  # TRAIN_ARGS: words on purpose
  if [[ -n "$TRAIN_ARGS" ]]; then cmd+=($TRAIN_ARGS); fi
}

# Start one run in the background, bounded by timeout (its process group: the ranks and workers
# too): launch NAME CUDA_VISIBLE_DEVICES TIMEOUT COMMAND...; the pid is left in $launched.
launched=""
launch() {
  local name=$1 cvd=$2 limit=$3
  shift 3
  local log="$OUT_DIR/$name.log"
  rm -f "$OUT_DIR/$name.stats.jsonl" "$OUT_DIR/$name.json"
  echo "\$ CUDA_VISIBLE_DEVICES=$cvd $*" | tee -a "$OUT_DIR/commands.txt"
  if [[ "$DRY_RUN" == 1 ]]; then launched=""; return 0; fi
  CUDA_VISIBLE_DEVICES="$cvd" timeout --kill-after=30 "$limit" "$@" >"$log" 2>&1 &
  launched=$!
}

# Wait for a launched run and append its record: finish PID NAME KIND(offloadd|torch) GPUS BATCH PART WHAT CMD
finish() {
  local pid=$1 name=$2 kind=$3 gpus=$4 batch=$5 part=$6 what=$7 cmdline=$8 rc=0
  [[ "$DRY_RUN" == 1 || -z "$pid" ]] && return 0
  wait "$pid" || rc=$?
  local log="$OUT_DIR/$name.log"
  if [[ "$kind" == offloadd ]]; then
    "${SUMMARIZE[@]}" record-offloadd --results "$RESULTS" --name "$name" --stats "$OUT_DIR/$name.stats.jsonl" \
      --rc "$rc" --log "$log" --gpus "$gpus" --batch "$batch" --skip "$SKIP_STEPS" --part "$part" \
      --what "$what" --command "$cmdline" || rc=99
  else
    "${SUMMARIZE[@]}" record-torch --results "$RESULTS" --name "$name" --json "$OUT_DIR/$name.json" \
      --rc "$rc" --log "$log" --gpus "$gpus" --batch "$batch" --part "$part" --what "$what" \
      --command "$cmdline" || rc=99
    # A PyTorch OOM (rc 1 with an "oom" row) is a result, not a failure of the script.
    if (( rc == 1 )) && grep -q '"status": "oom"' "$OUT_DIR/$name.json" 2>/dev/null; then rc=0; fi
  fi
  if (( rc != 0 )); then
    failures=$((failures + 1))
    echo "   ($name failed: rc $rc; log $log)"
    tail -5 "$log" 2>/dev/null | sed 's/^/   | /' || true
  fi
}

# One offloadd run in the foreground: offloadd_run NAME CVD GPUS BATCH STEPS WORKERS PART WHAT
offloadd_run() {
  local name=$1 cvd=$2 gpus=$3 batch=$4 steps=$5 workers=$6 part=$7 what=$8
  train_cmd "$gpus" "$batch" "$steps" "$workers" "$OUT_DIR/$name.stats.jsonl"
  launch "$name" "$cvd" "$RUN_TIMEOUT" "${cmd[@]}"
  finish "$launched" "$name" offloadd "$gpus" "$batch" "$part" "$what" "${cmd[*]}"
}

if has_part a; then
  say "a. 1 GPU, batch $B"
  offloadd_run solo 0 1 "$B" "$STEPS" "$WORKERS" a "1 GPU"
fi

if has_part b; then
  say "b. 2 GPUs (--gpus=2), batch $B per GPU"
  offloadd_run dp2 0,1 2 "$B" "$STEPS" "$WORKERS" b "2 GPUs, data parallel"
fi

if has_part c; then
  say "c. exactness: 1 GPU at batch $((2 * B)) vs 2 GPUs at batch $B, seed $SEED, $EXACT_STEPS steps"
  offloadd_run exact-1gpu 0 1 "$((2 * B))" "$EXACT_STEPS" "$WORKERS" c "1 GPU, the global batch"
  offloadd_run exact-2gpu 0,1 2 "$B" "$EXACT_STEPS" "$WORKERS" c "2 GPUs, same seed"
fi

if has_part d; then
  say "d. concurrency: two independent 1-GPU runs at once (workers $CONC_WORKERS each)"
  run_d=1
  if [[ "$SKIP_CONC" == 1 ]]; then
    echo "   skipped (SKIP_CONC=1)"
    run_d=0
  elif [[ "$DRY_RUN" != 1 ]]; then
    # Each run holds its own host states (16 bytes/parameter): both must fit in the host's memory.
    params=$("${SUMMARIZE[@]}" params --shape "$SHAPE")
    need_kib=$(( params * 16 * 22 / 10 / 1024 ))
    avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
    if (( avail_kib < need_kib )); then
      echo "   skipped: MemAvailable $((avail_kib / 1048576)) GiB < $((need_kib / 1048576)) GiB for two runs' host states"
      run_d=0
    fi
  fi
  if (( run_d )); then
    if [[ "$CONC_WORKERS" == "$WORKERS" ]] && [[ -s "$RESULTS" ]] && grep -q '"name": "solo"' "$RESULTS"; then
      echo "   (solo reference: run a, same worker layout)"
    else
      offloadd_run conc-solo 0 1 "$B" "$STEPS" "$CONC_WORKERS" d "1 GPU alone, workers $CONC_WORKERS"
    fi
    train_cmd 1 "$B" "$STEPS" "$CONC_WORKERS" "$OUT_DIR/conc-gpu0.stats.jsonl"
    cmd0=("${cmd[@]}")
    train_cmd 1 "$B" "$STEPS" "$CONC_WORKERS" "$OUT_DIR/conc-gpu1.stats.jsonl"
    cmd1=("${cmd[@]}")
    launch conc-gpu0 0 "$RUN_TIMEOUT" "${cmd0[@]}"
    pid0=$launched
    launch conc-gpu1 1 "$RUN_TIMEOUT" "${cmd1[@]}"
    pid1=$launched
    finish "$pid0" conc-gpu0 offloadd 1 "$B" d "GPU 0, beside GPU 1's run" "${cmd0[*]}"
    finish "$pid1" conc-gpu1 offloadd 1 "$B" d "GPU 1, beside GPU 0's run" "${cmd1[*]}"
  fi
fi

if has_part e; then
  if [[ "$SKIP_TORCH" == 1 ]]; then
    say "e. PyTorch baseline: skipped (SKIP_TORCH=1)"
  else
    say "e. PyTorch baseline (all on the GPU, no memory budget): 1 GPU and $TORCH_PARALLEL on 2 GPUs, batch $B per GPU"
    base=("$PYTHON" bench/pipeline/baseline_torch.py --shape "$SHAPE" --seq "$SEQ" --batch "$B"
          --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" --seed "$SEED" --device "$TORCH_DEVICE")
    [[ "$TORCH_DEVICE" == cuda ]] && base+=(--peak-tflops "$PEAK_TFLOPS")
    c=("${base[@]}" --json "$OUT_DIR/torch-1gpu.json")
    launch torch-1gpu 0 "$TORCH_TIMEOUT" "${c[@]}"
    finish "$launched" torch-1gpu torch 1 "$B" e "1 GPU, fp32 states on the GPU" "${c[*]}"
    for par in $TORCH_PARALLEL; do
      c=("${base[@]}" --parallel "$par" --nproc 2 --json "$OUT_DIR/torch-$par.json")
      launch "torch-$par" 0,1 "$TORCH_TIMEOUT" "${c[@]}"
      finish "$launched" "torch-$par" torch 2 "$B" e "2 GPUs, $par" "${c[*]}"
    done
  fi
fi

if [[ "$DRY_RUN" == 1 ]]; then
  say "dry run: commands above; nothing ran"
  exit 0
fi
say "results ($RESULTS; logs and stats in $OUT_DIR)"
"${SUMMARIZE[@]}" table --results "$RESULTS" --goal "$GOAL" --rtol "$EXACT_RTOL" --markdown "$OUT_DIR/summary.md" \
  || failures=$((failures + 1))
exit $(( failures > 0 ? 1 : 0 ))
