#!/usr/bin/env bash
# The demo's inputs, from the repository alone (examples/data; nothing beside the clone):
#   demo_prepare.sh DIR
# converts examples/data/stories260K (llama2.c format) into the Hugging Face directory
# DIR/models/stories260K, copies the Alpaca records to DIR/data/, and writes DIR/job.yaml:
# examples/job.yaml with /srv/offloadd replaced by DIR. Prints the job file's path.
# PYTHON names the interpreter for the conversion (numpy and safetensors; default python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# == 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1"
dir="$(cd "$1" && pwd)"
python="${PYTHON:-python3}"
examples="$here/examples"

model="$dir/models/stories260K"
if [[ ! -f "$model/config.json" ]]; then
  "$python" "$here/scripts/convert_llama2c.py" --model "$examples/data/stories260K/stories260K.bin" \
    --tokenizer "$examples/data/stories260K/tok512.bin" --out "$model" >/dev/null
fi
mkdir -p "$dir/data" "$dir/out"
cp "$examples/data/alpaca/alpaca_300.json" "$dir/data/"
# A fresh run: the daemon refuses an output_dir that holds another run's checkpoints.
rm -rf "$dir/out/stories260k-alpaca"
replacement="$(printf '%s/' "$dir" | sed 's/[\\&|]/\\&/g')"  # sed's special characters, escaped
sed "s|/srv/offloadd/|$replacement|g" "$examples/job.yaml" >"$dir/job.yaml"
echo "$dir/job.yaml"
