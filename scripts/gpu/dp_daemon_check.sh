#!/usr/bin/env bash
# Run ON A MACHINE WITH >= 3 GPUs (nvidia-h100-x4 / nvidia-h200-x4), from the repository root, with
# .debs carried (scripts/gpu/fetch_debs.sh): data parallelism through the daemon on
# GPUs that do not start at 0. The CPU half of the same check is
# tests/python/daemon/test_data_parallel_jobs.py; this one needs no Python gRPC (offloadctl only).
#   scripts/gpu/dp_daemon_check.sh build   build offloadd, -executor, -worker, -store, offloadctl
#   scripts/gpu/dp_daemon_check.sh run     the check below; exit 0 when every assertion holds
# The run: a long 1-GPU job holds GPU 0, so the scheduler places a 2-GPU job on GPUs 1 and 2.
# Asserted: its executors are rank 0 on GPU 1 and rank 1 on GPU 2; no process of that job holds
# memory on any other GPU (nvidia-smi sampled every 0.2 s: NCCL's barrier guessed the device as
# rank modulo the GPU count before the group was bound to the rank's GPU); it trains what one GPU
# trains on the whole batch (fp32, per-step loss within 1e-5). Logs go to $OUT_DIR (default $OUT,
# else /tmp/dpd). NVLink multicast stays off.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-/tmp/build-gpu}"
out="${OUT_DIR:-${OUT:-/tmp/dpd}}"
ws=/tmp/dpd-ws
mkdir -p "$out"

case "${1:-}" in
  build)
    NCCL_INCLUDE_DIR="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)"
    export NCCL_INCLUDE_DIR
    OFFLOADD_BUILD_DIR="$BUILD" OFFLOADD_GPU_TARGETS="offloadd offloadd-executor offloadd-worker offloadd-store offloadctl" \
      "$here/scripts/gpu/build_and_test.sh" -R '^none$' 2>&1 | grep -vE "^\[[0-9]+/[0-9]+\] (Building|Linking)" | tail -8
    exit "${PIPESTATUS[0]}"
    ;;
  run) ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac

export LD_LIBRARY_PATH="$here/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ctl() { "$BUILD/client/offloadctl" --target "unix://$ws/run/offloadd.sock" "$@"; }
rm -rf "$ws" && mkdir -p "$ws/state"
PYTHONPATH="$here/tests/python/trainer" python3 - "$ws" <<'PY' || exit 1
import pathlib, sys, yaml
from pipeline_testlib import build_model, write_pretokenized
ws = pathlib.Path(sys.argv[1])
build_model(ws / "model", layers=2)
write_pretokenized(ws / "data.jsonl", n=64)
for name, gpus, batch, steps in (("holder", 1, 4, 1000000), ("two", 2, 2, 8), ("one", 1, 4, 8)):
    spec = {"display_name": name, "model": {"path": str(ws / "model"), "compute_dtype": "fp32"},
            "dataset": {"paths": [str(ws / "data.jsonl")], "format": "pretokenized", "max_seq_length": 64},
            "training": {"learning_rate": 3e-3, "per_device_train_batch_size": batch, "max_steps": steps,
                         "warmup_steps": 2, "lr_scheduler_type": "cosine", "weight_decay": 0.1,
                         "max_grad_norm": 0.5, "seed": 7, "logging_steps": 1, "save_steps": 1000000},
            "output_dir": str(ws / name), "resources": {"gpus": gpus}}
    (ws / f"{name}.yaml").write_text(yaml.safe_dump(spec))
PY
cat >"$ws/offloadd.yaml" <<YAML
state_dir: $ws/state
allowed_roots: [$ws]
server: {unix_socket: $ws/run/offloadd.sock, unix_socket_mode: "0600"}
metrics: {listen: "127.0.0.1:0"}
storage: {directories: [{path: $ws}]}
YAML
"$BUILD/daemon/offloadd" --config "$ws/offloadd.yaml" >"$out/offloadd.log" 2>&1 &
daemon=$!
trap 'kill $daemon $sampler 2>/dev/null; wait' EXIT
for _ in $(seq 100); do ctl health >/dev/null 2>&1 && break; sleep 0.2; done
ctl node | tee "$out/node.txt" | head -12

holder=$(ctl -o json submit "$ws/holder.yaml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 600); do
  [[ "$(ctl -o json get "$holder" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" == JOB_STATE_RUNNING ]] && break
  sleep 0.2
done
echo "holder $holder running"
# GPU memory per process, every 0.2 s, for the whole run.
(while :; do nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader; sleep 0.2; done) >"$out/apps.csv" 2>/dev/null &
sampler=$!
nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader >"$out/gpus.csv"
rc=0
for name in two one; do
  id=$(ctl -o json submit "$ws/$name.yaml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  timeout 600 "$BUILD/client/offloadctl" --target "unix://$ws/run/offloadd.sock" -o json watch "$id" >"$out/$name.jsonl"
  echo "$name ($id): watch exit $?"
done
kill $sampler 2>/dev/null
ctl cancel "$holder" >/dev/null
python3 - "$out" <<'PY' || rc=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def events(name):
    return [json.loads(l) for l in (out / f"{name}.jsonl").read_text().splitlines() if l.strip()]
def logs(ev):
    return [e["log"]["message"] for e in ev if "log" in e]
def losses(ev):
    return {int(e["progress"]["step"]): float(e["progress"]["loss"]) for e in ev if "progress" in e and "loss" in e["progress"]}
two, one = events("two"), events("one")
print("\n".join(m for m in logs(two) if "executor started" in m or "data parallel" in m))
started = {}
for m in logs(two):
    if m.startswith("executor started"):
        started[int(m.split(" rank ")[1].split()[0])] = (int(m.split(" pid ")[1].split()[0]), m.split(" gpu ")[1].strip())
bus = {b.strip().lower(): int(i) for i, b in (l.split(",") for l in (out / "gpus.csv").read_text().splitlines() if "," in l)}
held = {}
for l in (out / "apps.csv").read_text().splitlines():
    if "," in l:
        pid, b = (x.strip() for x in l.split(","))
        if pid.isdigit():
            held.setdefault(int(pid), set()).add(bus.get(b.lower(), -1))
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok &= bool(cond)
check({r: g for r, (_, g) in started.items()} == {0: "1", 1: "2"}, f"ranks on GPUs {started}")
check(any("data parallel: rank 0 of 2 (nccl" in m and "cuda:1)" in m for m in logs(two)), "rank 0's group on cuda:1")
for r, (pid, g) in started.items():
    check(pid in held and held[pid] == {int(g)}, f"rank {r} (pid {pid}) holds memory on GPUs {sorted(held.get(pid, []))}, only {g}")
a, b = losses(one), losses(two)
check(sorted(a) == sorted(b) == list(range(1, 9)), f"steps {sorted(a)} / {sorted(b)}")
worst = max(abs(a[s] - b[s]) for s in a if s in b) if a and b else float("inf")
for s in sorted(a):
    print(f"step {s}: loss 1 GPU {a[s]:.7f}  2 GPUs {b.get(s, float('nan')):.7f}")
check(worst <= 1e-5, f"per-step loss within 1e-5 (worst {worst:.2e})")
sys.exit(0 if ok else 1)
PY
echo "dp_daemon_check: exit $rc"
exit $rc
