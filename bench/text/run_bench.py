#!/usr/bin/env python3
"""Runs offloadd-tokenizer-bench and the Python `tokenizers` library on the same texts and
prints one table (load time, encode MB/s single-threaded and batched).

    run_bench.py --build build-text [--tokenizer DIR_OR_FILE ...] [--corpus FILE] [--threads 2]

Python `tokenizers` is measured with a per-text encode() loop (one thread) and encode_batch()
(its Rust thread pool, RAYON_NUM_THREADS set to --threads). A directory is loaded on both sides the
way transformers' AutoTokenizer loads it. Figures are noisy on a shared machine: the script prints
the load average.
"""
import argparse
import json
import os
import pathlib
import subprocess
import time

HERE = pathlib.Path(__file__).resolve()
DATA = HERE.parents[3] / "shared" / "data"


def texts_of(corpus):
    data = json.loads(pathlib.Path(corpus).read_text(encoding="utf-8"))
    return [v for rec in data for v in rec.values() if isinstance(v, str) and v]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tokenizer", action="append")
    ap.add_argument("--corpus", default=str(DATA / "alpaca" / "alpaca_5000.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    toks = args.tokenizer or [str(DATA / "tokenizers" / n / "tokenizer.json")
                              for n in ("gpt2", "llama2")]
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    from tokenizers import Tokenizer
    texts = texts_of(args.corpus)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"corpus: {len(texts)} texts, {mb:.2f} MB; threads={args.threads}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'tokenizer':<12} {'impl':<10} {'load s':>7} {'1-thread MB/s':>14} "
          f"{args.threads}-thread MB/s")
    for path in toks:
        name = pathlib.Path(path).parent.name if path.endswith(".json") else pathlib.Path(path).name
        out = json.loads(subprocess.run(
            [str(pathlib.Path(args.build) / "bench" / "text" / "offloadd-tokenizer-bench"),
             "--tokenizer", path, "--corpus", args.corpus, "--threads", str(args.threads)],
            check=True, capture_output=True, text=True).stdout)
        print(f"{name:<12} {'offloadd':<10} {out['load_s']:>7.2f} "
              f"{out['warm_1_thread']['MB_per_s']:>14.2f} "
              f"{out[f'warm_{args.threads}_threads']['MB_per_s']:>13.2f}")
        t0 = time.perf_counter()
        if pathlib.Path(path).is_dir():  # the pipeline transformers builds for the directory
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(path).backend_tokenizer
        else:
            tok = Tokenizer.from_file(path)
        load = time.perf_counter() - t0
        for t in texts:  # warm the cache like the native warm pass
            tok.encode(t, add_special_tokens=False)
        t0 = time.perf_counter()
        for t in texts:
            tok.encode(t, add_special_tokens=False)
        single = time.perf_counter() - t0
        t0 = time.perf_counter()
        tok.encode_batch(texts, add_special_tokens=False)
        batch = time.perf_counter() - t0
        print(f"{name:<12} {'tokenizers':<10} {load:>7.2f} {mb / single:>14.2f} {mb / batch:>13.2f}")


if __name__ == "__main__":
    main()
