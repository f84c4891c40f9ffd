#!/usr/bin/env bash
# The compact optimizer modes on the GPU machine (docs/optimizer-modes.md): Llama-2-7B's shape at
# batch 8 (and `auto`), 24 GiB of GPU memory, seq 1024, clipping at 1.0, in each mode, against
# exact AdamW and native PyTorch (everything on the GPU, bench/pipeline/baseline_torch.py) in the
# same call on the same machine. Builds nothing: run from the repository root with a built CUDA
# flavour,
#
#   OFFLOADD_BUILD_DIR=/tmp/gpu-build bench/optimizer_modes/run_modes_bench.sh
#
# Each offloadd run is bench/pipeline/run_bench.py (random init, synthetic rows, 2 warm-up + 4
# timed steps, tokens/s over the timed ones, host RAM peak over the level before the run) with
# --state-dtype / --master-dtype; every run is limited to RUN_TIMEOUT seconds (90). The table at the
# end ($OUT_DIR/modes.md, rows also in $OUT_DIR/modes.json) has per mode and batch: tok/s, x exact,
# x PyTorch, host bytes per parameter (the plan log's arena B/parameter), the arena and the host
# RAM peak.
#
# Knobs (environment): OFFLOADD_BUILD_DIR (/tmp/gpu-build), OUT_DIR (/tmp/modes-bench), MODES
# ("fp32/fp32 bf16/fp32 int8/fp32 int8/bf16", state/master, exact first), BATCHES ("8 auto"),
# SHAPE (llama2-7b), SEQ (1024), BUDGET (24GiB), WORKERS (1x(cores-2)), RUN_TIMEOUT (90),
# SKIP_TORCH (0), PYTHON (python3). The minimum useful subset (about 4 minutes):
#   MODES="fp32/fp32 int8/fp32" BATCHES=8 bench/optimizer_modes/run_modes_bench.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if [[ -d "$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu" ]]; then  # as scripts/gpu/pipeline_check.sh
  export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
BUILD="${OFFLOADD_BUILD_DIR:-/tmp/gpu-build}"
OUT_DIR="${OUT_DIR:-/tmp/modes-bench}"
MODES="${MODES:-fp32/fp32 bf16/fp32 int8/fp32 int8/bf16}"
BATCHES="${BATCHES:-8 auto}"
SHAPE="${SHAPE:-llama2-7b}"
SEQ="${SEQ:-1024}"
BUDGET="${BUDGET:-24GiB}"
NCPU="$(nproc)"
WORKERS="${WORKERS:-1x$(( NCPU > 3 ? NCPU - 2 : 1 ))}"
RUN_TIMEOUT="${RUN_TIMEOUT:-90}"
SKIP_TORCH="${SKIP_TORCH:-0}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT_DIR/profile"
failures=0

if [[ ! -x "$BUILD/trainer/offloadd-train" ]]; then
  echo "no $BUILD/trainer/offloadd-train: build the CUDA flavour first (scripts/gpu/build_and_test.sh)" >&2
  exit 2
fi

if [[ "$SKIP_TORCH" != 1 ]]; then
  for b in $BATCHES; do
    [[ "$b" == auto ]] && continue
    echo "== PyTorch, everything on the GPU: $SHAPE batch $b"
    timeout "$RUN_TIMEOUT" "$PYTHON" bench/pipeline/baseline_torch.py --shape "$SHAPE" --seq "$SEQ" \
      --batch "$b" --steps 4 --warmup 2 --json "$OUT_DIR/torch-b$b.json" ||
      echo "PyTorch at batch $b failed or timed out (an out-of-memory is a result)"
  done
fi

for mode in $MODES; do
  state="${mode%/*}"
  master="${mode#*/}"
  for b in $BATCHES; do
    tag="${state}-${master}-b${b}"
    echo "== offloadd $SHAPE batch $b, $master master, $state states"
    if ! timeout "$RUN_TIMEOUT" "$PYTHON" bench/pipeline/run_bench.py --build "$BUILD" \
        --shape "$SHAPE" --seq "$SEQ" --batch "$b" --gpu-memory-limit "$BUDGET" \
        --workers "$WORKERS" --profile-dir "$OUT_DIR/profile" --calibration-params $((1 << 26)) \
        --train-args "--state-dtype=$state --master-dtype=$master" \
        --json "$OUT_DIR/$tag.json" > "$OUT_DIR/$tag.log" 2>&1; then
      echo "failed or timed out after ${RUN_TIMEOUT}s: $(tail -n 2 "$OUT_DIR/$tag.log" | tr '\n' ' ')"
      failures=$((failures + 1))
    fi
  done
done

"$PYTHON" - "$OUT_DIR" "$SHAPE" "$MODES" "$BATCHES" <<'EOF'
import json, pathlib, re, sys
out, shape, modes, batches = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
def load(p):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
torch = {}
for b in batches:
    got = load(out / f"torch-b{b}.json") or {}
    ok = [r for r in got.get("rows", []) if r.get("status") == "ok"]
    if ok:
        torch[b] = ok[0]["tokens_per_s"]
rows, lines = [], ["| mode | batch | tok/s | x exact | x PyTorch | host B/param | arena GiB | host RAM peak GiB |",
                   "|---|---|---|---|---|---|---|---|"]
exact = {}
for mode in modes:
    state, master = mode.split("/")
    for b in batches:
        r = (load(out / f"{state}-{master}-b{b}.json") or [{}])[0]
        tps = r.get("tokens_per_second", 0) if "error" not in r else 0
        if mode == "fp32/fp32":
            exact[b] = tps
        m = re.search(r"\(([0-9.]+) B/parameter,", r.get("plan", ""))
        row = {"mode": mode, "batch": b, "tokens_per_second": tps, "chosen": r.get("chosen", ""),
               "bytes_per_param": float(m.group(1)) if m else None, "arena_gib": r.get("arena_gib"),
               "host_peak_gib": r.get("host_peak_gib"), "error": r.get("error", "" if r else "no result")}
        rows.append(row)
        vs = lambda d: f"{tps / d[b]:.2f}" if tps and d.get(b) else "-"
        lines.append(f"| {'exact' if mode == 'fp32/fp32' else master + ' master, ' + state + ' states'} | {b} | "
                     f"{tps:.0f} | {vs(exact)} | {vs(torch)} | {row['bytes_per_param'] or '-'} | "
                     f"{(row['arena_gib'] or 0):.1f} | {(row['host_peak_gib'] or 0):.1f} |"
                     + (f" {row['error']}" if row["error"] else ""))
for b, t in torch.items():
    lines.append(f"| PyTorch (all on the GPU) | {b} | {t:.0f} | | 1.00 | | | |")
(out / "modes.json").write_text(json.dumps({"shape": shape, "rows": rows, "torch": torch}, indent=1))
(out / "modes.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
exit $(( failures > 0 ))
