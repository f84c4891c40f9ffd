#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts offloadd on a private socket under
# build/demo/, shows it serving (health, node info) through offloadctl, then submits the demo job
# (the pretrained stories260K Llama fine-tuned on Alpaca records, on the CPU unless the build has
# a GPU) and watches it train to the end, and says where the fine-tuned model was written.
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
cmake --build "$build" -j "$(nproc)" --target offloadd offloadctl offloadd-worker offloadd-store

demo="$build/demo"
python="${OFFLOADD_VENV:-$HOME/.cache/offloadd/venv}/bin/python"
mkdir -p "$demo"
cat >"$demo/offloadd.yaml" <<YAML
state_dir: $demo/state
allowed_roots: [$demo]
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
# The demo job, examples/job.yaml: Karpathy's pretrained stories260K Llama (examples/data,
# converted to a Hugging Face directory: safetensors + config.json + tokenizer.json) fine-tuned for
# 30 steps on 200 Alpaca records. Checked by the daemon (paths, model, tokenizer, dataset records,
# ranges, memory), queued, trained with the optimizer states in CPU RAM, checkpointed every 10
# steps, and exported as a Hugging Face model into its output_dir.
job="$(PYTHON="$python" "$here/scripts/demo_prepare.sh" "$demo")"
out="$demo/out/stories260k-alpaca"
echo "[demo] \$ offloadctl submit $job --watch"
"${ctl[@]}" submit "$job" --watch || {
  echo "[demo] the demo job did not succeed (daemon log: $demo/offloadd.log)" >&2
  exit 1
}
echo "[demo] fine-tuned model (Hugging Face format) written to $out:"
ls "$out" | sed 's/^/[demo]   /'
if [[ $keep == 1 ]]; then
  echo "[demo] left running as pid $pid; try: ${ctl[*]} node"
fi
