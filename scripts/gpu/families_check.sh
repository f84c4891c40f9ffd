#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root with .debs carried:
#   scripts/gpu/families_check.sh parity             # build + tests/python/engine/test_families_gpu.py
#   scripts/gpu/families_check.sh bench SPEC...      # offloadd-train (bench/pipeline/run_bench.py)
#   scripts/gpu/families_check.sh baseline SPEC...   # transformers on the GPU (baseline_torch.py)
# SPEC = SHAPE:BATCHES, e.g. qwen3-4b:16,auto gemma3-4b:16. Several modes may follow each other in
# one call: `families_check.sh parity -- bench qwen3-4b:16,auto -- baseline qwen3-4b:16,64`.
# Every mode builds first (a no-op once built; OFFLOADD_BUILD_DIR, default /tmp/offloadd-build-gpu,
# survives between calls while the machine stays warm). Logs and JSON go to $OUT (or /tmp).
# Benchmarks: seq 1024, --gpu-memory-limit 24GiB, max_grad_norm 1.0, bf16, 1x15 workers, 3 timed
# steps after 2 (STEPS / WARMUP override), no idle-core calibration (the step bound is not reported).
# DEADLINE_S (seconds, default 3600) stops the parity tests in time for the call to report; it
# counts from the script's start, the build (~2 min cold) included. PARITY_K selects variants
# (pytest -k, e.g. PARITY_K="qwen2 or gpt2"); OFFLOADD_ATTENTION_KERNEL (auto, cudnn, flash,
# efficient) passes through to offloadd-train.
# The parity tests read ../shared (tokenizers, Alpaca records; tests/python/conftest.py), which
# does not travel with the tree: `families_check.sh pack-shared` (here, before the call) packs what
# they read into .gpu-shared.tar.xz (5 MB; list it in .git/info/exclude), and `parity` unpacks it
# into ../shared on the GPU machine. Without either, parity stops instead of skipping every test.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
if [[ "${1:-}" == pack-shared ]]; then
  files=(data/alpaca/alpaca_5000.json)
  for t in llama3.1 mistral-7b-v0.3 qwen3 phi3-mini gpt2; do  # families_testlib.TOKENIZERS
    for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
      [[ -f "../shared/data/tokenizers/$t/$f" ]] && files+=("data/tokenizers/$t/$f")
    done
  done
  tar cJf .gpu-shared.tar.xz -C ../shared "${files[@]}" && ls -l .gpu-shared.tar.xz
  exit $?
fi
out="${OUT:-/tmp}"
export OFFLOADD_BUILD_DIR="${OFFLOADD_BUILD_DIR:-/tmp/offloadd-build-gpu}"
build="$OFFLOADD_BUILD_DIR"
steps="${STEPS:-3}"
warmup="${WARMUP:-2}"

t0=$(date +%s)
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store offloadd-engine-check" \
  scripts/gpu/build_and_test.sh -R '^$' >"$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
echo "== build $(( $(date +%s) - t0 )) s: $(grep -E 'CUDA flavour' "$build.configure.log" | head -1)"
export LD_LIBRARY_PATH="$here/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1

mode=""
while [[ $# -gt 0 ]]; do
  arg="$1"; shift
  case "$arg" in
    --) continue ;;
    parity|bench|baseline) mode="$arg"
      if [[ "$mode" == parity ]]; then
        t=$(date +%s)
        if [[ ! -d ../shared/data/tokenizers && -f .gpu-shared.tar.xz ]]; then
          mkdir -p ../shared && tar xJf .gpu-shared.tar.xz -C ../shared
        fi
        if [[ ! -d ../shared/data/tokenizers ]]; then
          echo "== parity: no ../shared/data/tokenizers and no .gpu-shared.tar.xz (run pack-shared first)"
          continue
        fi
        # DEADLINE_S: seconds the whole script may take; the tests stop in time to report.
        left=$(( ${DEADLINE_S:-3600} - (t - t0) - 15 ))
        OFFLOADD_BINARY_DIR="$build" timeout "$left" python3 -m pytest -q -s -p no:cacheprovider \
          ${PARITY_K:+-k "$PARITY_K"} tests/python/engine/test_families_gpu.py 2>&1 \
          | tee "$out/parity.log" \
          | grep -E "^[a-z0-9_]+ \[|^[a-z0-9_]+: weights|passed|failed|Error|error" | tail -60
        echo "== parity $(( $(date +%s) - t )) s"
      fi
      continue ;;
  esac
  IFS=: read -r shape batches <<<"$arg"
  t=$(date +%s)
  if [[ "$mode" == bench ]]; then
    # One log and JSON per shape and batch list: a shape may be benched twice in one call.
    tag="$shape-${batches//,/_}"
    python3 bench/pipeline/run_bench.py --build "$build" --shape "$shape" --batch "$batches" --seq 1024 \
      --gpu-memory-limit 24GiB --max-grad-norm 1.0 --steps "$steps" --warmup "$warmup" --no-calibrate \
      --speculate default --json "$out/bench-$tag.json" >"$out/bench-$tag.log" 2>&1
    grep -E "^\| $shape|batch size \(auto|^batch .*plan:|model parts|error" "$out/bench-$tag.log" | cut -c1-400
  elif [[ "$mode" == baseline ]]; then
    # "auto": the micro-batch offloadd's automatic batch trained (tokens per step / seq), read from
    # the bench run of the same shape earlier in the call.
    if [[ "$batches" == *auto* ]]; then
      auto=$(python3 -c "import json,sys; r=[x for f in sys.argv[1:] for x in json.load(open(f)) if str(x['batch']).startswith('auto') and 'tokens' in x]; print(round(r[0]['tokens'] / 1024) if r else '')" "$out"/bench-"$shape"-*.json 2>/dev/null)
      batches="${batches//auto/$auto}"; batches="${batches%,}"; batches="${batches#,}"
      echo "== baseline $shape: auto = micro-batch ${auto:-unknown}"
      [[ -n "$batches" ]] || continue
    fi
    python3 bench/pipeline/baseline_torch.py --shape "$shape" --batch "$batches" --seq 1024 \
      --steps "$steps" --warmup "$warmup" --peak-tflops 989 --json "$out/baseline-$shape.json" 2>&1 \
      | grep -v Warning | tail -8
  fi
  echo "== $mode $shape:$batches $(( $(date +%s) - t )) s"
done
exit 0
