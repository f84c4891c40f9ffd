#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts offloadd on a private socket under
# build/demo/, and shows it serving (health, node info) through offloadctl.
# The daemon is stopped (SIGTERM, clean drain) when the script ends; pass --keep to leave it up.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OFFLOADD_BUILD_DIR:-$here/build}"
keep=0
[[ "${1:-}" == "--keep" ]] && keep=1

"$here/scripts/setup.sh"
# shellcheck disable=SC2086
cmake -S "$here" -B "$build" -G Ninja ${OFFLOADD_CMAKE_ARGS:-} >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log" >&2; echo "[demo] CMake configure failed" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target offloadd offloadctl

demo="$build/demo"
python="${OFFLOADD_VENV:-$HOME/.cache/offloadd/venv}/bin/python"
mkdir -p "$demo"
cat >"$demo/offloadd.yaml" <<YAML
state_dir: $demo/state
allowed_roots: [$demo, $here/../shared/data]
server:
  unix_socket: $demo/run/offloadd.sock
  unix_socket_mode: "0600"
  shutdown_grace_seconds: 5
metrics:
  listen: 127.0.0.1:0
storage:
  directories:
    - path: $demo/state
YAML
ctl=("$build/client/offloadctl" --target "unix://$demo/run/offloadd.sock")

"$build/daemon/offloadd" --validate-config --config "$demo/offloadd.yaml" >/dev/null
"$build/daemon/offloadd" --config "$demo/offloadd.yaml" 2>"$demo/offloadd.log" &
pid=$!
stop() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" && echo "[demo] offloadd stopped cleanly" || echo "[demo] offloadd exited with status $?"
  fi
}
[[ $keep == 1 ]] || trap stop EXIT

# Wait for the socket to answer (the daemon logs and notifies when ready; a CLI user polls).
for _ in $(seq 100); do
  "${ctl[@]}" --timeout 1 health >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$demo/offloadd.log" >&2; echo "[demo] offloadd failed to start" >&2; exit 1; }
  sleep 0.2
done
echo "[demo] offloadd is up (log: $demo/offloadd.log)"
grep -E "metrics listening|serving gRPC" "$demo/offloadd.log" | sed 's/^/[demo]   /'
echo "[demo] \$ offloadctl health";  "${ctl[@]}" health
echo "[demo] \$ offloadctl node";    "${ctl[@]}" node
# The demo model: Karpathy's pretrained stories260K Llama, converted to a Hugging Face directory
# (safetensors + config.json + tokenizer.json), and a demo job on 200 Alpaca records, checked by
# the daemon (paths, model, tokenizer, dataset records, ranges, memory) and shown as it would run.
shared="$(cd "$here/.." && pwd)/shared/data"
if [[ -f "$shared/models/stories260K/stories260K.bin" ]]; then
  model="$demo/models/stories260K"
  if [[ ! -f "$model/config.json" ]]; then
    "$python" "$here/scripts/convert_llama2c.py" --model "$shared/models/stories260K/stories260K.bin" \
      --tokenizer "$shared/models/stories260K/tok512.bin" --out "$model" >/dev/null
  fi
  cat >"$demo/job.yaml" <<YAML
display_name: stories260k-alpaca-demo
model: {path: $model}
dataset:
  paths: [$shared/alpaca/alpaca_5000.json]
  format: alpaca
  max_seq_length: 256
  max_samples: 200
training: {learning_rate: 1e-3, per_device_train_batch_size: 8, max_steps: 50, warmup_steps: 5, logging_steps: 5}
output_dir: $demo/out/stories260k-alpaca
YAML
  echo "[demo] \$ offloadctl submit $demo/job.yaml --validate-only"
  "${ctl[@]}" submit "$demo/job.yaml" --validate-only
  echo "[demo]   ... (training jobs run once the offload pipeline lands; see README Status)"
fi
if [[ $keep == 1 ]]; then
  echo "[demo] left running as pid $pid; try: ${ctl[*]} node"
fi
