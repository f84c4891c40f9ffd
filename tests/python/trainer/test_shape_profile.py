"""The per-block profile: the step the plan is priced with (the first on a CPU
device) is recorded per block (forward, backward and recompute times, the bytes its activations
hold when kept and when recomputed) and cached under --profile-dir/shapes, keyed by device, model
fingerprint and micro-batch shape; the next run of the same key reads it back.

The kept bytes are measured (the tensors each block's forward saved, or its recompute re-created)
and must equal, on a CPU device, what the engine's saved-tensor list implies for a Llama decoder
layer: x, q, k, v, attention output, h, gate and up in the compute dtype, plus two RMSNorm
reciprocal roots and the attention logsumexp in fp32."""

import json

from pipeline_testlib import build_model, run_train

BATCH, SEQ, LAYERS = 4, 32, 3
HIDDEN, FF, HEADS, KV_HEADS = 32, 64, 4, 2  # build_model's config


def args(model, out, prof, *extra):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", "--random-init", f"--synthetic-seq={SEQ}", "--dtype=fp32",
            f"--batch-size={BATCH}", "--max-steps=3", "--workers=1x2", f"--output-dir={out}",
            f"--profile-dir={prof}", *extra]


def decoder_keep_bytes(elem=4):
    n = BATCH * SEQ
    head_dim = HIDDEN // HEADS
    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    return n * elem * (2 * HIDDEN + 2 * q + 2 * kv + 2 * FF) + n * 4 * (2 + HEADS)


def only_profile(prof):
    files = sorted((prof / "shapes").glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_each_block_is_profiled_and_cached_per_shape(binary_dir, tmp_path):
    model = build_model(tmp_path / "model", layers=LAYERS)
    prof = tmp_path / "profiles"
    r = run_train(binary_dir, args(model, tmp_path / "keep", prof, "--activations=keep"))
    assert "shape profile (step 1, cpu | llama/" in r.stderr, r.stderr
    p = only_profile(prof)
    # The model fingerprint counts blocks (embedding and head included).
    assert p["key"].startswith(f"cpu | llama/{LAYERS + 2} layers/"), p["key"]
    assert p["key"].endswith(f"| {BATCH}x{SEQ} Float"), p["key"]
    assert (p["batch"], p["seq"], p["dtype"], p["profiled_step"]) == (BATCH, SEQ, "Float", 1)
    names = [b["name"] for b in p["blocks"]]
    assert names == ["embedding"] + [f"model.layers.{i}" for i in range(LAYERS)] + ["head"], names
    for b in p["blocks"]:
        assert b["forward_s"] > 0 and b["backward_s"] > 0, b
    layers = p["blocks"][1:-1]
    for b in layers:
        assert b["mode"] == "keep" and b["recompute_s"] == 0, b
        assert b["keep_bytes"] == decoder_keep_bytes(), (b, decoder_keep_bytes())
        assert b["recompute_bytes"] == BATCH * SEQ * HIDDEN * 4, b
    # Recomputed: the same bytes are measured on the recompute, and the recompute costs a forward.
    r = run_train(binary_dir, args(model, tmp_path / "recompute", prof, "--activations=recompute"))
    assert "shape profile cached " in r.stderr, r.stderr  # the first run's, read back
    p = only_profile(prof)  # same key: replaced by this run's measurement
    for b in p["blocks"][1:-1]:
        assert b["mode"] == "recompute" and b["recompute_s"] == b["forward_s"] > 0, b
        assert b["keep_bytes"] == decoder_keep_bytes(), b
    # Another micro-batch shape is another profile; an unreadable one is measured again.
    run_train(binary_dir, args(model, tmp_path / "b2", prof, "--batch-size=2"))
    files = sorted((prof / "shapes").glob("*.json"))
    assert len(files) == 2
    for f in files:
        f.write_text("{")
    r = run_train(binary_dir, args(model, tmp_path / "again", prof, "--activations=keep"))
    assert "not a shape profile" in r.stderr and "this run measures it again" in r.stderr, r.stderr
    assert "shape profile (step 1" in r.stderr, r.stderr
