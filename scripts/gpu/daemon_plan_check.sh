#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repository root, .debs carried: the step
# planner's step-4 check of a job run through the daemon, and the daemon's --validate-only price.
#   scripts/gpu/daemon_plan_check.sh build   offloadd, -executor, -worker, -store, offloadctl
#   scripts/gpu/daemon_plan_check.sh run     the job below; its plan log lines and steps
# The job: a TinyLlama-1.1B-shaped checkpoint (random bf16 weights, bench/pipeline/startup_bench.py)
# with the Llama-2 tokenizer on Alpaca records (DATA: alpaca_5000.json and tokenizer.json, default
# .gpu-data), batch 8, max_seq_length 1024, max_grad_norm 1.0, a 6 GiB GPU budget, 5 steps. Then
# `offloadctl submit --validate-only` of the same job, with the node profile the job measured.
# BUILD (default /tmp/build-gpu) is the build; logs go to $OUT (default /tmp/dpc).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD:-/tmp/build-gpu}"
DATA="${DATA:-$here/.gpu-data}"
out="${OUT:-/tmp/dpc}"
ws=/tmp/dpc-ws
mkdir -p "$out"

case "${1:-}" in
  build)
    OFFLOADD_BUILD_DIR="$BUILD" OFFLOADD_GPU_TARGETS="offloadd offloadd-executor offloadd-worker offloadd-store offloadctl" \
      "$here/scripts/gpu/build_and_test.sh" -R '^none$' 2>&1 | grep -vE "^\[[0-9]+/[0-9]+\] (Building|Linking)" | tail -4
    exit "${PIPESTATUS[0]}"
    ;;
  run) ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac

export LD_LIBRARY_PATH="$here/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ctl() { "$BUILD/client/offloadctl" --target "unix://$ws/run/offloadd.sock" "$@"; }
rm -rf "$ws" && mkdir -p "$ws/state"
PYTHONPATH="$here/bench/pipeline" python3 - "$ws" "$DATA" <<'PY' || exit 1
import json, pathlib, shutil, sys
from startup_bench import write_checkpoint
ws, data = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
write_checkpoint("tinyllama-1.1b", ws / "model")
shutil.copy(data / "tokenizer.json", ws / "model" / "tokenizer.json")
shutil.copy(data / "alpaca_5000.json", ws / "alpaca.json")
spec = {"display_name": "plan-check", "model": {"path": str(ws / "model")},
        "dataset": {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 1024},
        "training": {"learning_rate": 1e-5, "lr_scheduler_type": "constant", "per_device_train_batch_size": 8,
                     "max_steps": 5, "max_grad_norm": 1.0, "logging_steps": 1, "save_steps": 1000000},
        "resources": {"gpu_memory_limit": 6 << 30}, "output_dir": str(ws / "out")}
(ws / "job.json").write_text(json.dumps(spec))
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
trap 'kill $daemon 2>/dev/null; wait' EXIT
for _ in $(seq 100); do ctl health >/dev/null 2>&1 && break; sleep 0.2; done
echo "== validate-only before the job (no node profile yet)"
ctl submit "$ws/job.json" --validate-only | grep "Predicted step"
id=$(ctl -o json submit "$ws/job.json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
timeout 400 "$BUILD/client/offloadctl" --target "unix://$ws/run/offloadd.sock" -o json watch "$id" >"$out/job.jsonl"
echo "job $id: watch exit $?"
python3 - "$out/job.jsonl" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for e in ev:
    m = e.get("log", {}).get("message", "")
    if any(k in m for k in ("step plan", "set-up", "validate", "padded lengths", "error")):
        print("log:", m[:900])
    p = e.get("progress") or {}
    st = p.get("step_time", p.get("stepTime"))
    if st:
        print(f"step {p.get('step')}: {st}, {p.get('tokens_per_second', p.get('tokensPerSecond'))} tokens/s")
PY
echo "== validate-only after the job (its node profile)"
ctl submit "$ws/job.json" --validate-only | grep "Predicted step"
