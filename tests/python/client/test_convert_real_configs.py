"""offloadctl convert on real public configurations (tests/data/configs/, PROVENANCE.md there): every
converted file validates on a real daemon (`convert --validate`, the daemon's validate-only), or
convert exits 6 naming the key that could not be. The Hub ids and registry names they give are
replaced with --model/--dataset/--output-dir, as a user does.

Two models: the README's demo (stories260K, 512 positions) and the same weights with
max_position_embeddings raised to 8192. The configurations' sequence lengths (1024 to 8192) are
refused on the first, naming the key that set them, and validate on the second."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "daemon"))
sys.path.insert(0, str(pathlib.Path(__file__).parent.parent))
from daemon_process import DaemonProcess  # noqa: E402
from demo_model import write_demo  # noqa: E402

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "data" / "configs"

# Per configuration: the dataset it reads (the format its keys say), and what convert says with
# the long model: None when the job validates, else the text that names the refused key.
CASES = {
    "trl/zephyr-7b-beta_sft_config_full.yaml": ("messages.jsonl", None),
    "trl/smollm2_sft_config.yaml": ("messages.jsonl", None),
    "axolotl/llama-3_fft-8b.yaml": (
        "alpaca.json", "`optimizer` (training.optim): 'paged_adamw_8bit' is not available"),
    "axolotl/llama-3_fft-8b-liger-fsdp.yaml": ("sharegpt.jsonl", None),
    "llamafactory/qwen3_full_sft.yaml": ("alpaca.json", None),
    "llamafactory/llama3_fp8_deepspeed_sft.yaml": ("alpaca.json", None),
    "deepspeed/llamafactory_ds_z3_offload_config.json": ("alpaca.json", None),
    "deepspeed/transformers_ds_config_zero3.json": ("alpaca.json", None),
}
# The key that sets each one's sequence length (refused on the 512-position model).
SEQ_KEY = {
    "trl/zephyr-7b-beta_sft_config_full.yaml": "`max_seq_length`",
    "trl/smollm2_sft_config.yaml": "`max_seq_length`",
    "axolotl/llama-3_fft-8b-liger-fsdp.yaml": "`sequence_len`",
    "llamafactory/qwen3_full_sft.yaml": "`cutoff_len`",
    "llamafactory/llama3_fp8_deepspeed_sft.yaml": "`cutoff_len`",
}


@pytest.fixture(scope="module")
def daemon(binary_dir, tmp_path_factory, source_dir):
    if not (binary_dir / "client" / "offloadctl").exists() or not (binary_dir / "daemon" / "offloadd").exists():
        pytest.skip("offloadctl or offloadd is not built")
    root = tmp_path_factory.mktemp("convert")
    write_demo(root, None, source_dir)  # the repository's copy: runs from a plain clone
    long = root / "stories260K-8k"
    shutil.copytree(root / "stories260K", long)
    config = json.loads((long / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (long / "config.json").write_text(json.dumps(config))
    turns = [("What is 2+2?", "4"), ("Name a colour.", "Blue."), ("Say hi.", "Hi!")]
    with open(root / "messages.jsonl", "w") as f:
        for q, a in turns * 4:
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")
    with open(root / "sharegpt.jsonl", "w") as f:
        for q, a in turns * 4:
            f.write(json.dumps({"conversations": [{"from": "human", "value": q},
                                                  {"from": "gpt", "value": a}]}) + "\n")
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", root).start()
    yield d, root
    d.stop()


def convert(binary_dir, d, root, name, model, tag):
    dataset = CASES[name][0]
    out = root / f"{tag}-{pathlib.Path(name).stem}.yaml"
    r = subprocess.run(
        [str(binary_dir / "client" / "offloadctl"), "--target", d.target, "convert", str(CONFIGS / name),
         "--model", str(root / model), "--dataset", str(root / dataset), "--output-dir",
         str(root / f"out-{tag}-{pathlib.Path(name).stem}"), "--out", str(out), "--validate"],
        capture_output=True, text=True, timeout=120)
    return r, out


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_real_config_validates_or_is_refused_by_key(binary_dir, daemon, name):
    d, root = daemon
    r, out = convert(binary_dir, d, root, name, "stories260K-8k", "long")
    refused = CASES[name][1]
    if refused is None:
        assert r.returncode == 0, r.stderr + d.log()[-2000:]
        assert out.exists()
        # What convert validated is what submit --validate-only accepts.
        v = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", d.target, "submit", str(out),
                            "--validate-only"], capture_output=True, text=True, timeout=120)
        assert v.returncode == 0, v.stderr
    else:
        assert r.returncode == 6, r.stderr
        assert refused in r.stderr, r.stderr
        assert not out.exists(), "nothing is written for a job that could not validate"
    # The "changes what is trained" list holds no library internals.
    for internal in ("_n_gpu", "ray_scope", "liger_", "attn_implementation", "plot_loss", "report_to", "hub_"):
        assert f": {internal}" not in r.stderr.split("key(s) about")[0], r.stderr


@pytest.mark.parametrize("name", sorted(SEQ_KEY))
def test_a_sequence_length_beyond_the_models_positions_is_refused_naming_its_key(binary_dir, daemon, name):
    d, root = daemon
    r, out = convert(binary_dir, d, root, name, "stories260K", "short")
    assert r.returncode == 6, r.stderr
    line = next((x for x in r.stderr.splitlines() if "(dataset.max_seq_length)" in x), "")
    assert SEQ_KEY[name] in line and "max_position_embeddings is 512" in line, r.stderr
    assert not out.exists() and not out.with_suffix(".chat_template.jinja").exists()


def test_named_and_inline_templates_are_written_beside_the_job(binary_dir, daemon):
    d, root = daemon
    _, out = convert(binary_dir, d, root, "axolotl/llama-3_fft-8b-liger-fsdp.yaml", "stories260K-8k", "tmpl")
    job = out.read_text()
    template = out.parent / (out.stem + ".chat_template.jinja")
    assert f"template: {template}" in job and "format: sharegpt" in job, job
    assert template.read_text() == (pathlib.Path(__file__).resolve().parents[3] / "client/templates/llama3.jinja").read_text()


def training_arguments_dump(path: pathlib.Path, **values) -> dict:
    """A Hugging Face TrainingArguments dump as to_json_string writes it (every field the installed
    transformers declares, enums as their values), each at its default unless given. Written from
    the dataclass's fields: constructing one would need accelerate."""
    transformers = pytest.importorskip("transformers")
    import dataclasses
    import enum
    dump = {}
    for f in dataclasses.fields(transformers.TrainingArguments):
        if not f.init:
            continue
        v = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        dump[f.name] = v.value if isinstance(v, enum.Enum) else v
    unknown = set(values) - set(dump)
    assert not unknown, f"not TrainingArguments fields in transformers {transformers.__version__}: {unknown}"
    dump.update(values)
    path.write_text(json.dumps(dump, indent=2, default=str))
    return dump


def test_a_training_arguments_dump_of_the_installed_transformers_validates(binary_dir, daemon):
    """The HF kind on a real dump: all of the installed transformers' TrainingArguments fields (112
    in 5.17), as a script that sets a few leaves the rest. The job validates; the keys that change
    training are mapped (none is listed as dropped), the rest are sorted into the quiet groups."""
    d, root = daemon
    dump = training_arguments_dump(root / "training_args.json", output_dir="out", learning_rate=2e-5,
                                   per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=10,
                                   lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.01,
                                   logging_steps=1, save_steps=5, save_total_limit=2, seed=7, optim="adamw_torch")
    out = root / "hf-training_args.yaml"
    r = subprocess.run(
        [str(binary_dir / "client" / "offloadctl"), "--target", d.target, "convert", str(root / "training_args.json"),
         "--model", str(root / "stories260K"), "--dataset", str(root / "alpaca.json"), "--output-dir",
         str(root / "out-hf"), "--out", str(out), "--validate"],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + d.log()[-2000:]
    job = out.read_text()
    for field in ("learning_rate: 2e-05", "max_steps: 10", "gradient_accumulation_steps: 2", "save_total_limit: 2"):
        assert field in job, job
    assert len(dump) > 50
    assert "change what is trained" not in r.stderr, r.stderr
