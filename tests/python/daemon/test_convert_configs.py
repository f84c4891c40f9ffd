"""offloadctl convert end to end: configurations of Hugging Face Trainer, TRL,
Axolotl and DeepSpeed, written here from their documented fields, are converted into job files,
and each job then trains the README's demo model (stories260K on Alpaca records) on the real
daemon to SUCCEEDED, exporting a model. The conversion's own cases (every key mapped or listed
with its reason, merges, contradictions) are tests/client/config_convert_test.cc."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from demo_model import write_demo  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def demo(tmp_path_factory, source_dir):
    return write_demo(tmp_path_factory.mktemp("demo"), None, source_dir)  # examples/data: from a plain clone


@pytest.fixture()
def daemon(binary_dir, tmp_path, demo):
    # The daemon reads only under its allowed roots (symlinks resolved): copy the demo in.
    shutil.copytree(demo, tmp_path / "demo")
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path).start()
    yield d, tmp_path / "demo"
    d.stop()


def hf_training_arguments(**values) -> dict:
    """What TrainingArguments.to_json_string() writes: every field, at its default unless given."""
    transformers = pytest.importorskip("transformers")
    out = {}
    for f in dataclasses.fields(transformers.TrainingArguments):
        v = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if isinstance(v, enum.Enum):
            v = v.value
        try:
            json.dumps(v)
        except TypeError:
            v = str(v)
        out[f.name] = v
    out.update(values)
    return out


COMMON_HF = dict(learning_rate=1e-3, per_device_train_batch_size=4, max_steps=STEPS, warmup_steps=1,
                 logging_steps=1, save_steps=STEPS, report_to="none", lr_scheduler_type="cosine",
                 gradient_checkpointing=True, bf16=False, fp16=False, optim="adamw_torch")


def configs(ws: pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    """Per case: the files to convert (name, text)."""
    trl = {  # SFTConfig: TrainingArguments plus TRL's data fields
        "output_dir": "/tmp/ignored-by-cli", "learning_rate": 1e-3, "per_device_train_batch_size": 4,
        "max_steps": STEPS, "logging_steps": 1, "max_length": 128, "packing": False,
        "completion_only_loss": True, "dataset_text_field": "text", "bf16": False, "report_to": "none"}
    axolotl = {
        "base_model": str(ws / "stories260K"), "datasets": [{"path": str(ws / "alpaca.json"), "type": "alpaca"}],
        "sequence_len": 128, "sample_packing": False, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
        "max_steps": STEPS, "optimizer": "adamw_torch", "lr_scheduler": "cosine", "learning_rate": 1e-3,
        "train_on_inputs": False, "bf16": "auto", "gradient_checkpointing": True, "warmup_steps": 1,
        "logging_steps": 1, "flash_attention": True, "output_dir": str(ws / "out-axolotl"), "wandb_project": None}
    deepspeed = {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0,
        "bf16": {"enabled": False}, "zero_optimization": {
            "stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}, "overlap_comm": True},
        "steps_per_print": 1}
    return {
        "hf": [("training_args.json", json.dumps(hf_training_arguments(output_dir="/tmp/x", **COMMON_HF)))],
        "trl": [("sft_config.yaml", yaml.safe_dump(trl))],
        "axolotl": [("axolotl.yml", yaml.safe_dump(axolotl))],
        "hf+deepspeed": [("training_args.json", json.dumps(hf_training_arguments(output_dir="/tmp/x", **COMMON_HF))),
                         ("ds_config.json", json.dumps(deepspeed))],
    }


def ctl(binary_dir, *args, check=True):
    r = subprocess.run([str(binary_dir / "client" / "offloadctl"), *args], capture_output=True, text=True,
                       timeout=300)
    assert not check or r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.mark.parametrize("case", ["hf", "trl", "axolotl", "hf+deepspeed"])
def test_a_converted_config_trains_the_demo_model(binary_dir, daemon, case):
    d, ws = daemon
    files = []
    for name, text in configs(ws)[case]:
        (ws / name).write_text(text)
        files.append(str(ws / name))
    out = ws / f"out-{case.replace('+', '-')}"
    args = ["convert", *files, "--out", str(ws / "job.yaml"), "-o", "json"]
    if case != "axolotl":  # Axolotl's config names its model, data and output itself
        args += ["--model", str(ws / "stories260K"), "--dataset", str(ws / "alpaca.json"), "--output-dir", str(out)]
    report = json.loads(ctl(binary_dir, *args).stdout)
    assert report["missing"] == [], report
    job = yaml.safe_load((ws / "job.yaml").read_text())
    assert job["training"]["max_steps"] == STEPS
    if case == "hf+deepspeed":
        assert job["offload"]["offload_optimizer"]["device"] == "cpu"
        assert job["training"]["max_grad_norm"] == 1.0
        assert "zero_optimization.overlap_comm" in [x["key"] for x in report["internals"]]
    if case == "axolotl":
        assert job["dataset"] == {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 128,
                                  "packing": False, "mask_prompt": True}
        out = ws / "out-axolotl"
    # Nothing that changes training was dropped from these configs, and the job runs to the end.
    assert report["dropped"] == [] or case == "trl", report["dropped"]
    r = ctl(binary_dir, "--target", d.target, "submit", str(ws / "job.yaml"), "--watch", check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:] + d.log()[-3000:]
    assert (out / "model.safetensors").exists(), sorted(p.name for p in out.iterdir()) if out.exists() else out
    # The Alpaca records were rendered with offloadd's built-in chat template (stories260K's tokenizer
    # has none): the exported model carries it, so apply_chat_template formats prompts as training did.
    template = (out / "chat_template.jinja").read_text()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == template
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    text = tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], tokenize=False,
                                   add_generation_prompt=True)
    assert "Name a colour." in text


def test_convert_refuses_to_overwrite_and_names_contradictions(binary_dir, tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"learning_rate": 1e-3}))
    (tmp_path / "b.json").write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}}))
    (tmp_path / "job.yaml").write_text("keep: me\n")
    r = ctl(binary_dir, "convert", str(tmp_path / "a.json"), "--out", str(tmp_path / "job.yaml"), check=False)
    assert r.returncode == 2 and "is not overwritten" in r.stderr, r.stderr
    assert (tmp_path / "job.yaml").read_text() == "keep: me\n"
    r = ctl(binary_dir, "convert", str(tmp_path / "a.json"), str(tmp_path / "b.json"), check=False)
    assert r.returncode == 6 and "training.learning_rate" in r.stderr and "b.json" in r.stderr, r.stderr
    r = ctl(binary_dir, "convert", str(tmp_path / "missing.json"), check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
