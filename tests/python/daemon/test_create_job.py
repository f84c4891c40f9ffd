"""CreateJob through the real daemon: validation errors by field path, validate_only dry runs, job
files from offloadctl and the Python SDK."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402

import offloadd  # noqa: E402


@pytest.fixture()
def workspace(tmp_path, shared_dir):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}))
    (model / "model.safetensors").write_bytes(b"x")
    shutil.copy(shared_dir / "data" / "tokenizers" / "gpt2" / "tokenizer.json", model / "tokenizer.json")
    alpaca = json.loads((shared_dir / "data" / "alpaca" / "alpaca_5000.json").read_text())[:20]
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in alpaca))
    return tmp_path


@pytest.fixture()
def daemon(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    yield d
    d.stop()


def spec_dict(ws: pathlib.Path) -> dict:
    return {
        "display_name": "tiny",
        "model": {"path": str(ws / "model")},
        "dataset": {"paths": [str(ws / "alpaca.jsonl")], "format": "alpaca", "max_seq_length": 128},
        "training": {"learning_rate": 3e-4, "per_device_train_batch_size": 2, "max_steps": 10},
        "output_dir": str(ws / "out"),
        # The model's config.json leaves GPT-2's dropouts at transformers' 0.1.
        "dropout": "disable",
    }


def test_validate_only_returns_resolved_spec(daemon, workspace):
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec_dict(workspace), validate_only=True)
    assert job.spec.training.learning_rate == pytest.approx(3e-4)
    assert job.spec.training.adam_beta2 == pytest.approx(0.999), "defaults are filled in"
    assert offloadd.v1.job_pb2.DatasetFormat.Name(job.spec.dataset.format) == "DATASET_FORMAT_ALPACA"
    assert job.spec.output_dir == str(workspace.resolve() / "out")
    # The model as the engine assembles it.
    assert job.model.model_type == "gpt2" and job.model.architecture == "GPT2LMHeadModel"
    assert job.model.parts.startswith("gpt2: LayerNorm pre-norm, MHA 4 head_dim 16, q/k/v/o bias, GELU MLP"), \
        job.model.parts
    # 50257 x 64 + 256 x 64 embeddings, 2 layers of 4 x 64^2 + 2 x 64 x 256 weights, their biases and
    # LayerNorms, ln_f: transformers' num_parameters() of this config.
    assert job.model.parameters == 3332928


def test_validate_only_names_the_family_and_parts_of_a_qwen3_model(daemon, workspace):
    (workspace / "model" / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 50257, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "rope_theta": 1000000.0, "tie_word_embeddings": True}))
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec_dict(workspace), validate_only=True)
    assert job.model.parts == ("qwen3: RMSNorm pre-norm, GQA 4/2 head_dim 32, per-head q/k norm, SwiGLU, "
                               "RoPE default θ=1e6, tied head"), job.model.parts
    assert job.model.architecture == "Qwen3ForCausalLM"


def test_dropout_the_engine_would_drop_is_refused_unless_disabled(daemon, workspace):
    spec = spec_dict(workspace)
    del spec["dropout"]
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(spec, validate_only=True)
        fields = {v.field: v.description for v in e.value.field_violations}
        assert list(fields) == ["dropout"], fields
        assert "embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1" in fields["dropout"]
        assert "dropout: disable" in fields["dropout"]
        job = c.create_job({**spec, "dropout": "disable"}, validate_only=True)
        assert offloadd.v1.job_pb2.DropoutMode.Name(job.spec.dropout) == "DROPOUT_MODE_DISABLE"
        # A model without dropout needs no setting.
        config = json.loads((workspace / "model" / "config.json").read_text())
        config.update(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
        (workspace / "model" / "config.json").write_text(json.dumps(config))
        job = c.create_job(spec, validate_only=True)
        assert job.spec.dropout == 0


def test_all_problems_come_back_with_field_paths(daemon, workspace):
    spec = spec_dict(workspace)
    spec["training"].update(learning_rate=-1, lr_scheduler_type="exponential")
    spec["dataset"]["paths"].append("/etc/passwd")
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(spec, validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert set(fields) >= {"training.learning_rate", "training.lr_scheduler_type", "dataset.paths[1]"}, fields
    assert "outside the allowed roots" in fields["dataset.paths[1]"]
    assert "3 problems" in e.value.message


def test_valid_job_is_queued_and_fails_with_a_clear_error_when_its_weights_are_broken(daemon, workspace):
    # Validation only checks that model.safetensors exists; the job fails when the trainer reads it.
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec_dict(workspace))
        assert offloadd.v1.job_pb2.JobState.Name(job.state) == "JOB_STATE_QUEUED"
        done = c.wait(job.id, timeout=60)
    assert offloadd.v1.job_pb2.JobState.Name(done.state) == "JOB_STATE_FAILED"
    assert "model.safetensors" in done.error.message, done.error.message


def test_optimizer_ratio_out_of_range_is_refused_with_its_path(daemon, workspace):
    spec = spec_dict(workspace)
    spec.setdefault("offload", {}).update({"offload_optimizer": {"device": "cpu", "ratio": 1.5}})
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(spec, validate_only=True)
        fields = {v.field: v.description for v in e.value.field_violations}
        assert "must be in [0, 1]" in fields["offload.offload_optimizer.ratio"], fields
        spec["offload"]["offload_optimizer"]["ratio"] = 0.5
        c.create_job(spec, validate_only=True)  # accepted


def test_lsp_compression_is_refused_on_a_node_with_a_gpu_only(daemon, workspace):
    """Every setting acts; LSP's one limit is the node (its CUDA path is not built): this node has
    no GPU, so the spec validates with the seed's defaults filled in."""
    spec = spec_dict(workspace)
    spec["compression"] = {"type": "lsp"}
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec, validate_only=True)
    comp = job.spec.compression
    assert (comp.subspace_rank, comp.sparsity, comp.projector_update_interval) == (512, 16, 1000)


def test_request_id_makes_create_idempotent_across_restarts(binary_dir, workspace):
    """The same request_id created two jobs."""
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        spec = spec_dict(workspace)
        spec["training"]["max_steps"] = 1
        with offloadd.Client(d.target) as c:
            first = c.create_job(spec, request_id="retry-7")
            again = c.create_job(spec, request_id="retry-7")
            assert again.id == first.id and again.request_id == "retry-7"
            other = c.create_job(spec, request_id="retry-8")
            assert other.id != first.id
            changed = {**spec, "display_name": "changed"}
            with pytest.raises(offloadd.AlreadyExists) as e:
                c.create_job(changed, request_id="retry-7")
            assert first.id in e.value.message
            with pytest.raises(offloadd.InvalidArgument) as e:
                c.create_job(spec, request_id="k" * 129)
            assert [v.field for v in e.value.field_violations] == ["request_id"]
        d.stop()
        d.start()
        with offloadd.Client(d.target) as c:
            assert c.create_job(spec, request_id="retry-7").id == first.id
            assert len(list(c.list_jobs())) == 2
    finally:
        d.stop()


def test_oversized_strings_are_refused_and_errors_stay_readable(daemon, workspace):
    """Unbounded strings in job records; an error echoing invalid
    UTF-8 or a megabyte-long value broke the SDK's parsing or hid the message."""
    spec = spec_dict(workspace)
    spec["display_name"] = "x" * (3 << 20)
    spec["labels"] = {f"k{i}": "v" for i in range(65)}
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(spec, validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert fields["display_name"] == "3145728 bytes, more than the 256 allowed", fields
    assert "65 labels" in fields["labels"]
    assert len(e.value.message) < 4096
    # A dataset whose record is not UTF-8: the error echoes it.
    bad = workspace / "latin1.jsonl"
    bad.write_bytes(b'{"instruction": "caf\xe9 \xff", "input": "", "output": "x"}\n')
    spec = spec_dict(workspace)
    spec["dataset"]["paths"] = [str(bad)]
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:  # parses: every string is valid UTF-8
            c.create_job(spec, validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert list(fields) == ["dataset.paths[0]"], fields
    assert "latin1.jsonl:1" in fields["dataset.paths[0]"], fields


def test_unknown_field_in_dict_is_refused_by_sdk(workspace):
    spec = spec_dict(workspace)
    spec["training"]["learning_rat"] = 1e-4
    with pytest.raises(ValueError, match="learning_rat"):
        offloadd.job_spec(spec)


def test_offloadctl_submit_validate_only(binary_dir, daemon, workspace):
    job = workspace / "job.yaml"
    job.write_text(textwrap.dedent(f"""\
        display_name: tiny
        model: {{path: {workspace / "model"}}}
        dataset:
          paths: [{workspace / "alpaca.jsonl"}]
          format: alpaca
          max_seq_length: 128
        training: {{learning_rate: 3e-4, per_device_train_batch_size: 2, max_steps: 10}}
        offload: {{offload_optimizer: {{device: cpu}}}}
        output_dir: {workspace / "out"}
        dropout: disable
        """))
    ctl = [str(binary_dir / "client" / "offloadctl"), "--target", daemon.target]
    r = subprocess.run(ctl + ["submit", str(job), "--validate-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout and '"lr_scheduler_type": "linear"' in r.stdout
    assert "model: gpt2: LayerNorm pre-norm, MHA 4 head_dim 16" in r.stdout, r.stdout
    assert "(GPT2LMHeadModel), 3332928 parameters" in r.stdout, r.stdout

    job.write_text(job.read_text().replace("learning_rate", "learning_rat"))
    r = subprocess.run(ctl + ["submit", str(job), "--validate-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 6 and "learning_rat" in r.stderr  # 6: invalid job file

    job.write_text(job.read_text().replace("learning_rat", "learning_rate").replace("max_steps: 10", "max_steps: 0"))
    r = subprocess.run(ctl + ["submit", str(job), "--validate-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 6, r.stderr
    assert "training.max_steps: must be -1 (use num_train_epochs) or positive" in r.stderr


def test_validate_only_prices_the_step_on_the_nodes_profile(binary_dir, daemon, workspace):
    """Validate_only answers with the step priced on this node (the step
    planner's cost model on <state_dir>/profiles/node-profile.json); without a node profile it says
    why there is none, and offloadctl submit --validate-only prints it."""
    spec = spec_dict(workspace)
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec, validate_only=True)
    assert not job.step_estimate.available
    assert job.step_estimate.text.startswith("no estimate: no node profile on this node yet"), job.step_estimate
    profiles = workspace / "state" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "node-profile.json").write_text(json.dumps({
        "key": "test-node", "host_bytes_per_s": 1e12, "cpu_params_per_s": 1e6, "threads": 2, "kernel": "portable",
        "h2d_bytes_per_s": 0, "d2h_bytes_per_s": 0, "both_bytes_per_s": 0, "measure_seconds": 1,
        "measured_at": "2026-11-27T00:00:00Z"}))
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec, validate_only=True)
    e = job.step_estimate
    assert e.available and e.step_seconds > 0, e
    # A CPU node (CI): the updates at 1e6 parameters/s set the step, held for the clipping norm.
    assert e.bound in ("CPU update", "held updates"), e
    assert not e.lower_bound and "node profile test-node of 2026-11-27T00:00:00Z" in e.basis, e
    # micro-batch 2 x 1 accumulation x 128 tokens per row per step.
    assert e.tokens_per_second * e.step_seconds == pytest.approx(2 * 128, rel=1e-9)
    job_file = workspace / "job.json"
    job_file.write_text(json.dumps(spec))
    ctl = [str(binary_dir / "client" / "offloadctl"), "--target", daemon.target]
    r = subprocess.run(ctl + ["submit", str(job_file), "--validate-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Predicted step: " in r.stdout and "s/step" in r.stdout and "basis: node profile test-node" in r.stdout


def test_oversized_request_is_refused_and_daemon_stays_up(binary_dir, tmp_path):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path)
    d.config_path.write_text(d.config_path.read_text().replace("  shutdown_grace_seconds: 5\n",
                                                               "  shutdown_grace_seconds: 5\n  max_request_bytes: 64KiB\n"))
    d.start()
    try:
        with offloadd.Client(d.target) as c:
            with pytest.raises(offloadd.OffloaddError) as e:
                c.create_job({"display_name": "x" * (128 << 10)}, validate_only=True)
            assert e.value.code.name == "RESOURCE_EXHAUSTED"
            assert c.health() == "SERVING"
    finally:
        d.stop()


def _vm_hwm_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_concurrent_validations_do_not_multiply_memory(daemon, workspace):
    """Each CreateJob allocated 64 MiB per dataset path; 150 concurrent calls
    on a 52-byte dataset peaked at 2.3 GB. Now a dataset head is read in 1 MiB pieces and at most
    4 validations run at once (2 for one client): the daemon's peak RSS grows by well
    under 150 x 64 MiB."""
    from concurrent.futures import ThreadPoolExecutor

    small = workspace / "small.jsonl"
    small.write_text(json.dumps({"instruction": "hi", "input": "", "output": "yo"}) + "\n")
    spec = spec_dict(workspace)
    spec["dataset"]["paths"] = [str(small)] * 4
    # The calls queue behind 2 validations at a time (one client's share of the 4); on a loaded
    # 2-core machine the last ones wait past the SDK's default 30 s deadline. Memory is what is
    # measured here, not latency.
    with offloadd.Client(daemon.target, timeout=180) as c:
        c.create_job(spec, validate_only=True)  # warm: tokenizer and template code paths loaded
        before = _vm_hwm_bytes(daemon.proc.pid)
        with ThreadPoolExecutor(max_workers=150) as pool:
            jobs = list(pool.map(lambda _: c.create_job(spec, validate_only=True), range(150)))
    assert all(j.spec.dataset.paths[0] == str(small.resolve()) for j in jobs)
    grown = _vm_hwm_bytes(daemon.proc.pid) - before
    assert grown < 512 << 20, f"peak RSS grew by {grown >> 20} MiB"
    print(f"peak RSS grew by {grown >> 20} MiB over 150 concurrent validations")


def test_yaml_alias_bomb_is_refused_by_sdk_and_offloadctl(binary_dir, tmp_path):
    """A 300-byte alias bomb made offloadctl abort."""
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\ndisplay_name: bomb\n")
    assert bomb.stat().st_size < 400
    with pytest.raises(ValueError, match="expands to more than 100000 values"):
        offloadd.job_spec(bomb)
    r = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", "unix:///nonexistent",
                        "submit", str(bomb), "--validate-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.returncode < 128, (r.returncode, r.stderr)  # an error, not a crash
    assert "expands to more than 100000 values" in r.stderr, r.stderr


def test_pasted_hf_names_and_sizes_act_through_the_daemon(daemon, workspace):
    """HF/TRL names and sizes with units are accepted and show up as the settings they
    stand for in the resolved spec."""
    spec = spec_dict(workspace)
    del spec["dataset"]["max_seq_length"]
    spec["training"].update({"bf16": True, "fp16": False, "gradient_checkpointing": True, "optim": "adamw_torch",
                             "warmup_steps": 0.1, "lr_scheduler_type": "cosine_with_min_lr",
                             "lr_scheduler_kwargs": {"min_lr": 3e-5}, "max_length": 96,
                             "completion_only_loss": False})
    spec["resources"] = {"host_memory_limit": "8GiB"}
    spec["offload"] = {"aio": {"block_size": "2MiB"}}
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec, validate_only=True)
    s, pb = job.spec, offloadd.v1.job_pb2
    assert pb.ComputeDtype.Name(s.model.compute_dtype) == "COMPUTE_DTYPE_BF16"
    assert pb.ActivationMode.Name(s.offload.activations.mode) == "ACTIVATION_MODE_RECOMPUTE"
    assert s.dataset.max_seq_length == 96 and not s.dataset.mask_prompt
    assert s.training.warmup_ratio == pytest.approx(0.1) and s.training.warmup_steps == 0
    assert s.training.lr_scheduler_kwargs.min_lr == pytest.approx(3e-5)
    assert s.training.lr_scheduler_kwargs.num_cycles == pytest.approx(0.5)
    assert s.resources.host_memory_limit == 8 << 30 and s.offload.aio.block_size == 2 << 20
    for name in ("bf16", "fp16", "gradient_checkpointing", "optim", "max_length", "completion_only_loss"):
        assert not s.training.HasField(name), f"{name} is resolved into its setting, not kept"

    spec["training"]["optim"] = "adafactor"
    with offloadd.Client(daemon.target) as c, pytest.raises(offloadd.InvalidArgument) as e:
        c.create_job(spec, validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert "offloadd trains with AdamW (optim: adamw_torch, adamw_torch_fused" in fields["training.optim"]

    # 8-bit AdamW's name is int8 states, which the trainer runs (with an fp32 master).
    spec["training"]["optim"] = "adamw_bnb_8bit"
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec, validate_only=True)
    assert job.spec.optimizer.state_dtype == pb.STATE_DTYPE_INT8, job.spec.optimizer


def test_spec_and_daemon_problems_come_back_in_one_run(binary_dir, daemon, workspace):
    """The spec's own problems and the daemon's for the rest, in one error (SDK and offloadctl)."""
    spec = spec_dict(workspace)
    spec["training"]["learning_rat"] = 1e-4
    spec["training"]["max_steps"] = 0  # the daemon's range check
    spec["resources"] = {"gpu_memory_limit": "8 GX"}
    del spec["output_dir"]
    with offloadd.Client(daemon.target) as c, pytest.raises(offloadd.JobSpecError) as e:
        c.create_job(spec, validate_only=True)
    fields = [v.field for v in e.value.field_violations]
    assert fields[:2] == ["training.learning_rat", "resources.gpu_memory_limit"], fields
    assert "training.max_steps" in fields and "output_dir" in fields, fields

    job = workspace / "job.yaml"
    job.write_text(textwrap.dedent(f"""\
        model: {{path: {workspace / "model"}}}
        dataset: {{paths: [{workspace / "alpaca.jsonl"}], max_seq_length: 128}}
        training: {{learning_rat: 3e-4, max_grad_nrom: 1.0, max_steps: 0}}
        resources: {{gpu_memory_limit: 8GiB}}
        dropout: disable
        """))
    r = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", daemon.target, "submit", str(job),
                        "--validate-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 6, r.stderr
    assert f"{job}: 4 problems in the job spec:" in r.stderr, r.stderr
    for line in ("training.learning_rat: unknown field; did you mean `learning_rate`?",
                 "training.max_grad_nrom: unknown field; did you mean `max_grad_norm`?",
                 "training.max_steps: must be -1", "output_dir: required"):
        assert line in r.stderr, r.stderr
