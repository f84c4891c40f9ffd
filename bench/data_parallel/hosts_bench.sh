#!/usr/bin/env bash
# Run ON AN x2 H200 HOST, from the repository root, after
# `OFFLOADD_BUILD_DIR=/tmp/gpu-build scripts/gpu/build_and_test.sh` (this builds nothing):
# ZeRO-1 across two simulated hosts (two offloadd-train processes, one GPU and one arena each,
# the torchrun environment over loopback TCP) against one group with one arena on the same two
# GPUs (--gpus=2). Llama-2-7B, batch 8 per GPU, seq 1024, 24 GiB, clipping at 1.0; 1x(W/2)
# workers per host vs 1xW for the group (W = cores - 2). Prints tokens/s (steps > 2), the losses,
# the hosts' step lines and the overhead of two hosts; the rank 0 trace shows the `gather` track.
#   SKIP_GROUP=1   the two-host run only (compare with an earlier group run)
#   STEPS=N        optimizer steps per run (default 7)
set -u
cd "$(dirname "$0")/../.."
build=${OFFLOADD_BUILD_DIR:-/tmp/gpu-build}
out=${OUT:-/tmp/hosts-overlap}
mkdir -p "$out"
[[ -d .gpu-prefix ]] &&
  export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
M=/tmp/m7b
python3 bench/data_parallel/summarize.py model-dir --shape llama2-7b --out $M >/dev/null || exit 1
NC=$(nproc); W=$(( NC - 2 )); WH=$(( W / 2 ))
common=(--model=$M --random-init --synthetic-seq=1024 --device=cuda --dtype=bf16 --batch-size=8
  --max-steps=${STEPS:-7} --gpu-memory-limit=24GiB --max-grad-norm=1.0 --lr=1e-5
  --scheduler=constant --speculate=never --seed=42 --no-export --profile-dir=/tmp/prof-hosts
  --parallel-timeout=300)
# (a) two hosts, one rank each, separate arenas, loopback TCP
for r in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    GROUP_RANK=$r CUDA_VISIBLE_DEVICES=$r timeout 240 $build/trainer/offloadd-train "${common[@]}" \
    --workers=1x$WH --stats-jsonl=$out/hosts$r.jsonl --trace=$out/hosts_trace.json \
    > $out/hosts$r.log 2>&1 &
done
wait
echo "hosts done $(( $(date +%s) - t0 )) s"
# (b) one group, one arena, 2 GPUs
if [[ -z "${SKIP_GROUP:-}" ]]; then
  CUDA_VISIBLE_DEVICES=0,1 timeout 200 $build/trainer/offloadd-train "${common[@]}" --gpus=2 \
    --workers=1x$W --stats-jsonl=$out/group.jsonl > $out/group.log 2>&1
  echo "group rc $? done $(( $(date +%s) - t0 )) s"
fi
grep -h -E "ZeRO|error|rror" $out/hosts0.log $out/hosts1.log | cut -c1-300 | head -8
grep -h -E "^step|s step" $out/hosts0.log | tail -4 | cut -c1-300
python3 - $out <<'PY'
import json, sys, pathlib
o = pathlib.Path(sys.argv[1])
def rows(f):
    return [json.loads(l) for l in open(f) if '"loss"' in l and '"step_seconds"' in l] if f.exists() else []
res = {}
for name, f in (("group", o / "group.jsonl"), ("hosts", o / "hosts0.jsonl")):
    r = rows(f); t = [x for x in r if x["step"] > 2 and x["step_seconds"] > 0]
    tps = sum(x["tokens"] / x["step_seconds"] for x in t) / len(t) if t else 0
    res[name] = tps
    print(name, "steps", len(r), "tok/s %.0f" % tps, "step s", [round(x["step_seconds"], 2) for x in r],
          "losses", [round(x["loss"], 5) for x in r])
if res.get("group") and res.get("hosts"):
    print("overhead of two hosts: %.1f%%" % (100 * (res["group"] / res["hosts"] - 1)))
PY
echo "all $(( $(date +%s) - t0 )) s"
