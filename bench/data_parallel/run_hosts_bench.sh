#!/usr/bin/env bash
# ZeRO-1 across hosts, simulated on one GPU machine. Run ON THE GPU MACHINE from the repository
# root with a built CUDA offloadd-train; builds nothing:
#
#   TRAIN=/tmp/gpu-build/trainer/offloadd-train bench/data_parallel/run_hosts_bench.sh
#
# Runs, on G GPUs (GPUS, default: every GPU nvidia-smi lists, rounded down to even; G >= 2):
#   a  one group, one arena:  offloadd-train --gpus=G (CUDA_VISIBLE_DEVICES=0..G-1), the fp32 states
#                             once in one arena, updated by WORKERS
#   b  two simulated hosts:   G ranks started with the torchrun environment (WORLD_SIZE=G,
#                             LOCAL_WORLD_SIZE=G/2, GROUP_RANK=0/1), each host with its own arena
#                             (its half of every block's states, HOST_WORKERS each) and its own G/2
#                             GPUs; NCCL_HOSTID differs per host, so NCCL treats them as two nodes:
#                             NVLink/P2P inside a host, TCP sockets over loopback between them
#                             (NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1); Gloo over lo
# G=2 is one rank per host; G=4 two ranks per host (a shared arena per host).
# Both: Llama-2-7B (SHAPE), random init, synthetic tokens of SEQ (1024), batch B (8) per GPU,
# --gpu-memory-limit=BUDGET (24GiB), --max-grad-norm=1.0, bf16, STEPS (4) steps, the same seed.
# Prints tokens/s of each (mean over the steps after SKIP_STEPS=1), the overhead of b against a,
# the host RAM peak of a's group and of each of b's hosts (Pss of the ranks, workers and stores;
# hosts_bench.py), and the per-step loss agreement. Each run is bounded by RUN_TIMEOUT (150 s).
#
# Knobs: TRAIN, OUT_DIR (/tmp/hosts-bench), GPUS, B, STEPS, SKIP_STEPS, SHAPE, SEQ, BUDGET, SEED
# (42), WORKERS (1x(cores-2)), HOST_WORKERS (1x(cores/2-1)), RUN_TIMEOUT, PARTS ("a b"), PYTHON
# (python3), TRAIN_ARGS (more flags for both), DRY_RUN=1 (print the commands only).
# Exit status: 0 when both runs finished and the report was made, 1 otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # NVLink SHARP multicast stays off
if [[ -d "$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu" ]]; then  # as scripts/gpu/pipeline_check.sh
  export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

TRAIN="${TRAIN:-/tmp/gpu-build/trainer/offloadd-train}"
OUT_DIR="${OUT_DIR:-/tmp/hosts-bench}"
if [[ -z "${GPUS:-}" ]]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  GPUS=$(( GPUS / 2 * 2 ))
fi
B="${B:-8}"
STEPS="${STEPS:-4}"
SKIP_STEPS="${SKIP_STEPS:-1}"
SHAPE="${SHAPE:-llama2-7b}"
SEQ="${SEQ:-1024}"
BUDGET="${BUDGET:-24GiB}"
SEED="${SEED:-42}"
NCPU="$(nproc)"
WORKERS="${WORKERS:-1x$(( NCPU > 3 ? NCPU - 2 : 1 ))}"
HOST_WORKERS="${HOST_WORKERS:-1x$(( NCPU > 5 ? NCPU / 2 - 1 : 1 ))}"
RUN_TIMEOUT="${RUN_TIMEOUT:-150}"
PARTS="${PARTS:-a b}"
PYTHON="${PYTHON:-python3}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
DRY_RUN="${DRY_RUN:-0}"
HELPER=("$PYTHON" bench/data_parallel/hosts_bench.py)
MODEL="$OUT_DIR/model-$SHAPE"
PROFILE_DIR="$OUT_DIR/profile"

if (( GPUS < 2 || GPUS % 2 != 0 )); then
  echo "error: GPUS=$GPUS: two simulated hosts need an even number of GPUs, at least 2" >&2
  exit 2
fi
if [[ "$DRY_RUN" != 1 && ! -x "$TRAIN" ]]; then
  echo "error: TRAIN=$TRAIN is not an executable offloadd-train (build it first, or set TRAIN)" >&2
  exit 2
fi
mkdir -p "$OUT_DIR" "$PROFILE_DIR"
PER_HOST=$(( GPUS / 2 ))
echo "== $SHAPE, seq $SEQ, batch $B per GPU, $STEPS steps, budget $BUDGET, $GPUS GPUs;" \
  "a: --gpus=$GPUS, workers $WORKERS; b: 2 hosts x $PER_HOST ranks, workers $HOST_WORKERS per host"
if [[ "$DRY_RUN" != 1 ]] && ! "$PYTHON" bench/data_parallel/summarize.py model-dir --shape "$SHAPE" \
    --out "$MODEL" >/dev/null; then
  echo "error: could not write the model directory $MODEL" >&2
  exit 2
fi

common() {  # the flags of both runs: common WORKERS STATS
  cmd=("$TRAIN" "--model=$MODEL" --random-init "--synthetic-seq=$SEQ" --device=cuda --dtype=bf16
       "--batch-size=$B" "--max-steps=$STEPS" "--gpu-memory-limit=$BUDGET" --max-grad-norm=1.0
       --lr=1e-5 --scheduler=constant --speculate=never "--seed=$SEED" "--workers=$1"
       "--profile-dir=$PROFILE_DIR" "--stats-jsonl=$2" --no-export "--parallel-timeout=$RUN_TIMEOUT")
  # shellcheck disable=SC2206  # TRAIN_ARGS: words on purpose
  if [[ -n "$TRAIN_ARGS" ]]; then cmd+=($TRAIN_ARGS); fi
}

seq_csv() { seq -s, "$1" "$2"; }
failures=0

if [[ " $PARTS " == *" a "* ]]; then
  echo "== a. one group, one arena: --gpus=$GPUS"
  rm -f "$OUT_DIR/one.stats.jsonl" "$OUT_DIR/one.peak.json"
  common "$WORKERS" "$OUT_DIR/one.stats.jsonl"
  cmd+=("--gpus=$GPUS")
  echo "\$ CUDA_VISIBLE_DEVICES=$(seq_csv 0 $((GPUS - 1))) ${cmd[*]}" | tee "$OUT_DIR/commands.txt"
  if [[ "$DRY_RUN" != 1 ]]; then
    start=$(date +%s)
    CUDA_VISIBLE_DEVICES=$(seq_csv 0 $((GPUS - 1))) timeout --kill-after=10 "$RUN_TIMEOUT" "${cmd[@]}" \
      >"$OUT_DIR/one.log" 2>&1 &
    pid=$!
    "${HELPER[@]}" sample --out "$OUT_DIR/one.peak.json" --label "a: one group" "$pid" &
    sampler=$!
    rc=0; wait "$pid" || rc=$?
    wait "$sampler" || true
    echo "   rc $rc, $(( $(date +%s) - start )) s; log $OUT_DIR/one.log"
    if (( rc != 0 )); then failures=$((failures + 1)); tail -5 "$OUT_DIR/one.log" | sed 's/^/   | /'; fi
  fi
fi

if [[ " $PARTS " == *" b "* ]]; then
  echo "== b. two simulated hosts x $PER_HOST ranks, separate arenas, TCP over loopback between them"
  rm -f "$OUT_DIR/hosts.stats.jsonl" "$OUT_DIR"/hosts-h*.peak.json
  port=$(( 20000 + RANDOM % 20000 ))
  pids=()
  start=$(date +%s)
  for (( r = 0; r < GPUS; r++ )); do
    h=$(( r / PER_HOST ))
    common "$HOST_WORKERS" "$OUT_DIR/hosts.stats.jsonl"
    env_r=(CUDA_VISIBLE_DEVICES="$(seq_csv $((h * PER_HOST)) $((h * PER_HOST + PER_HOST - 1)))"
           MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK="$r" WORLD_SIZE="$GPUS"
           LOCAL_RANK=$(( r % PER_HOST )) LOCAL_WORLD_SIZE="$PER_HOST" GROUP_RANK="$h"
           GROUP_WORLD_SIZE=2 NCCL_HOSTID="offloadd-sim-host-$h" NCCL_SOCKET_IFNAME=lo
           NCCL_IB_DISABLE=1 GLOO_SOCKET_IFNAME=lo)
    echo "\$ ${env_r[*]} ${cmd[*]}" | tee -a "$OUT_DIR/commands.txt"
    if [[ "$DRY_RUN" != 1 ]]; then
      env "${env_r[@]}" timeout --kill-after=10 "$RUN_TIMEOUT" "${cmd[@]}" >"$OUT_DIR/hosts-rank$r.log" 2>&1 &
      pids+=($!)
    fi
  done
  if [[ "$DRY_RUN" != 1 ]]; then
    samplers=()
    for h in 0 1; do
      "${HELPER[@]}" sample --out "$OUT_DIR/hosts-h$h.peak.json" --label "b: host $h" \
        "${pids[@]:$((h * PER_HOST)):$PER_HOST}" &
      samplers+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    for s in "${samplers[@]}"; do wait "$s" || true; done
    echo "   rc $rc, $(( $(date +%s) - start )) s; logs $OUT_DIR/hosts-rank*.log"
    if (( rc != 0 )); then
      failures=$((failures + 1))
      for (( r = 0; r < GPUS; r++ )); do tail -3 "$OUT_DIR/hosts-rank$r.log" | sed "s/^/   rank $r | /"; done
    fi
  fi
fi

[[ "$DRY_RUN" == 1 ]] && exit 0
echo "== report ($OUT_DIR/report.json)"
"${HELPER[@]}" report --one "$OUT_DIR/one.stats.jsonl" --hosts "$OUT_DIR/hosts.stats.jsonl" \
  --skip "$SKIP_STEPS" --json "$OUT_DIR/report.json" \
  --peaks "$OUT_DIR/one.peak.json" "$OUT_DIR/hosts-h0.peak.json" "$OUT_DIR/hosts-h1.peak.json" \
  || failures=$((failures + 1))
exit $(( failures > 0 ? 1 : 0 ))
