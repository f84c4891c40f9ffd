"""Layer inputs (the checkpoints of recomputed layers, recompute_offload_cpu) wait in pinned RAM, or
on NVMe when the host memory limit cannot hold them all: the planner moves the fewest lowest
layers' inputs to the activation spill, names them in the plan log, and the run trains to the same
bytes as one that keeps them all in RAM (the spill's write and read are a byte-exact round trip).

The shape makes the inputs large beside the rest (16 layers of width 128, priced at
max_seq_length 2048 and 8 rows: 8 MiB each), while the records themselves are short, so the
steps are fast on a CPU."""

import json

import torch
import transformers
from safetensors.torch import load_file

from pipeline_testlib import VOCAB, build_tokenizer, read_stats, run_train, write_pretokenized

LAYERS = 16
MIB = 1 << 20


def build_model(out):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=LAYERS, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=2048,
                                   eos_token_id=0, bos_token_id=0)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    build_tokenizer(out / "tokenizer.json")
    return out


def args(model, data, out, store, *extra):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
            "--dtype=fp32", "--batch-size=8", "--grad-accum=2", "--max-seq-length=2048",
            "--max-steps=2", "--lr=1e-3", "--max-grad-norm=1.0", "--seed=3", "--workers=1x2",
            "--activations=recompute_offload_cpu", f"--nvme-dir={store}",
            f"--profile-dir={out.parent}/profiles", f"--output-dir={out}",
            f"--stats-jsonl={out}/stats.jsonl", *extra]


def test_layer_inputs_over_the_host_limit_go_to_nvme_and_train_the_same(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=64)
    store = tmp_path / "store"
    store.mkdir()  # the node profile measures its rates, which price the placement
    # What the job needs with every layer input in pinned RAM.
    r = run_train(binary_dir, args(model, data, tmp_path / "priced", store, "--validate-only"))
    need = json.loads(r.stdout.strip().splitlines()[1])["predicted_host_bytes"]
    ram, nvme = tmp_path / "ram", tmp_path / "nvme"
    a = run_train(binary_dir, args(model, data, ram, store))
    assert "recompute_offload_cpux16" in a.stdout + a.stderr
    # 1 MiB less: the spill's store process (64 MiB) and its staging buffer (five 8 MiB records)
    # come with the first move, so 14 inputs go (112 MiB freed, 104 MiB added), the top two stay.
    b = run_train(binary_dir, args(model, data, nvme, store, f"--host-memory-limit={need - MIB}"))
    log = b.stdout + b.stderr
    assert "layer inputs: layers 0-13 on NVMe (112 MiB written and read per micro-batch" in log, log
    assert "layers 14-15 in pinned RAM (16 MiB)" in log, log
    assert " per step at the store's rates against " in log, log
    assert "recompute_offload_cpux2 recompute_offload_nvmex14" in log, log
    sa, sb = read_stats(ram / "stats.jsonl"), read_stats(nvme / "stats.jsonl")
    assert [s["loss"] for s in sa] == [s["loss"] for s in sb]
    assert [s["grad_norm"] for s in sa] == [s["grad_norm"] for s in sb]
    assert all(s["nvme_activation_bytes"] == 0 for s in sa)
    assert all(s["nvme_activation_bytes"] > 0 for s in sb)
    wa, wb = load_file(ram / "model.safetensors"), load_file(nvme / "model.safetensors")
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_layer_inputs_over_the_limit_without_a_store_are_refused(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    a = [x for x in args(model, data, tmp_path / "out", tmp_path / "store") if not x.startswith("--nvme-dir")]
    r = run_train(binary_dir, a + ["--validate-only"])
    need = json.loads(r.stdout.strip().splitlines()[1])["predicted_host_bytes"]
    r = run_train(binary_dir, a + ["--validate-only", f"--host-memory-limit={need - MIB}"], check=False)
    assert r.returncode != 0 and "RESOURCE_EXHAUSTED" in r.stderr, r.stderr
    assert "activation checkpoints in pinned RAM 128 MiB" in r.stderr, r.stderr
    assert "the layer inputs on NVMe (nvme_path, --nvme-dir=DIR)" in r.stderr, r.stderr
