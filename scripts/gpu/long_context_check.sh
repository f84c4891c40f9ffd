#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, .debs carried: builds the engine's CUDA flavour
# (only the document-attention GPU test and the layer benchmark), runs the variable-length flash
# correctness test (bf16 against the masked fp32 reference, forward and backward, packed
# documents, sliding window; a packed 32K row's peak), then one Llama-3-8B-shaped decoder layer
# (hidden 4096, 32/8 heads, ffn 14336), one sequence, for each RUNS entry seq:documents (packed
# rows: documents > 1), beside transformers' LlamaDecoderLayer (sdpa; packed: with the
# block-diagonal mask) in the same lease. OUT receives the logs and one JSON per layer run.
#   OFFLOADD_BUILD_DIR=/tmp/b RUNS="8192:1 32768:1 32768:4" scripts/gpu/long_context_check.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${OFFLOADD_BUILD_DIR:-$PWD/build-gpu}"
OUT="${OUT:-/tmp}"
t0=$(date +%s)
OFFLOADD_GPU_TARGETS="engine_doc_attention_gpu_test offloadd-engine-layer-bench" \
  scripts/gpu/build_and_test.sh -R '^$' > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
head -2 "$OUT/build.log"
echo "build: $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
timeout "${TEST_TIMEOUT:-120}" "$build/tests/engine/engine_doc_attention_gpu_test" 2>&1 | tee "$OUT/gpu_test.log" \
  | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |packed 32K|Failure|rror|Expected|Which is|actual"
for run in ${RUNS:-8192:1 32768:1 32768:4}; do
  seq=${run%%:*} docs=${run##*:}
  t1=$(date +%s)
  timeout "${LAYER_TIMEOUT:-90}" python3 bench/engine/bench_layer.py --build-dir "$build" --hidden 4096 \
    --heads 32 --kv-heads 8 --intermediate 14336 --seq "$seq" --batches 1 --iters "${ITERS:-3}" \
    --warmup 1 --docs "$docs" --impls sdpa --json "$OUT/layer-$seq-$docs.json" 2>&1 | grep -E "^\||^#|rror|Killed"
  echo "($(( $(date +%s) - t1 )) s)"
done
exit 0
