"""Job specs in the Python SDK: sizes with units everywhere, every problem at once with
snake_case paths and "did you mean", HF/TRL names read, and the same spellings as offloadctl's
reader (client/cpp/spec_reader.cc; tests/client/job_file_test.cc checks the C++ side). Types and
ranges are protobuf's json_format's; what values mean is the daemon's to check."""

from __future__ import annotations

import pytest

import offloadd
from offloadd.job_file import merge_violations
from offloadd.spec_reader import BYTE_SIZE_FIELDS, nearest_name, parse_byte_size
from offloadd.v1 import job_pb2


def problems(spec: dict) -> dict:
    with pytest.raises(offloadd.JobSpecError) as e:
        offloadd.job_spec(spec)
    return {v.field: v.description for v in e.value.field_violations}


def test_every_problem_at_once_with_snake_case_paths_and_suggestions():
    got = problems({
        "trainingg": {},
        "packing": True,
        "model": {"path": ["a", "b"], "computeDtype": "bf16"},
        "dataset": {"format": "alpca", "paths": "/one.jsonl", "max_seq_len": 512},
        "training": {"learning_rat": 1e-4, "max_grad_nrom": 1.0, "maxSteps": 2.5,
                     "per_device_train_batch_size": "many", "logging_steps": 10},
        "resources": {"gpu_memory_limit": "8 GX"},
        "offload": {"activations": {"layer_overrides": {"x": "keep", 1: "sometimes"}}},
        "labels": {"team": ["a"]},
    })
    want = {
        "trainingg": "did you mean `training`?",
        "packing": "did you mean `dataset.packing`?",
        "model.path": "expected string or bytes-like object, got 'list'",
        "dataset.format": "unknown value 'alpca'; did you mean `alpaca`?",
        "dataset.paths": "expected a list",
        "dataset.max_seq_len": "did you mean `max_seq_length`?",
        "training.learning_rat": "did you mean `learning_rate`?",
        "training.max_grad_nrom": "did you mean `max_grad_norm`?",
        "training.max_steps": "Couldn't parse integer: 2.5",
        "training.per_device_train_batch_size": "'many'",
        "resources.gpu_memory_limit": "unknown size unit 'gx'",
        "offload.activations.layer_overrides[x]": "invalid literal for int() with base 10: 'x'",
        "offload.activations.layer_overrides[1]": "unknown value 'sometimes'",
        "labels[team]": "got 'list'",
    }
    assert set(got) == set(want), got
    for field, text in want.items():
        assert text in got[field], (field, got[field])
    # The valid fields are listed in snake_case (protobuf's own error listed camelCase).
    assert "(fields of training: learning_rate, per_device_train_batch_size, gradient_accumulation_steps," \
        in got["training.learning_rat"]
    assert "learningRate" not in got["training.learning_rat"]


def test_error_is_invalid_argument_and_value_error_and_keeps_what_read(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: {path: /m}\ntraining: {learning_rat: 1, max_grad_nrom: 2, seed: 7}\n")
    with pytest.raises(ValueError) as e:
        offloadd.job_spec(job)
    err = e.value
    assert isinstance(err, offloadd.InvalidArgument)
    assert [v.field for v in err.field_violations] == ["training.learning_rat", "training.max_grad_nrom"]
    assert str(err).startswith(f"INVALID_ARGUMENT: {job}: 2 problems in the job spec\n  training.learning_rat:")
    assert err.spec.model.path == "/m" and err.spec.training.seed == 7


def test_sizes_accept_units_everywhere():
    spec = offloadd.job_spec({"resources": {"gpu_memory_limit": "8GiB", "host_memory_limit": "500MB"},
                              "offload": {"aio": {"block_size": "1 MiB", "queue_depth": 64}}})
    assert spec.resources.gpu_memory_limit == 8 << 30
    assert spec.resources.host_memory_limit == 500_000_000
    assert spec.offload.aio.block_size == 1 << 20
    assert offloadd.job_spec({"resources": {"gpu_memory_limit": 25769803776}}).resources.gpu_memory_limit == 24 << 30
    for bad in (-1, "1.5B", True, "lots"):
        assert "resources.gpu_memory_limit" in problems({"resources": {"gpu_memory_limit": bad}})
    assert parse_byte_size("1.5GiB") == 3 << 29
    assert parse_byte_size("24 gib") == 24 << 30


def test_every_uint64_field_of_the_spec_is_a_byte_size():
    seen, todo, sizes = set(), [job_pb2.JobSpec.DESCRIPTOR], set()
    while todo:
        d = todo.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        for f in d.fields:
            if f.message_type is not None:
                todo.append(f.message_type)
            if f.cpp_type == f.CPPTYPE_UINT64:
                sizes.add(f.full_name)
    assert sizes == BYTE_SIZE_FIELDS


def test_hf_names_read_and_fractional_warmup_is_a_ratio():
    spec = offloadd.job_spec({"training": {
        "bf16": True, "fp16": False, "gradient_checkpointing": True, "optim": "adamw_torch_fused",
        "warmup_steps": 0.1, "lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "max_length": 2048, "completion_only_loss": True, "assistant_only_loss": None}})
    t = spec.training
    assert t.bf16 and t.HasField("fp16") and not t.fp16 and t.gradient_checkpointing
    assert t.optim == "adamw_torch_fused" and t.max_length == 2048 and t.completion_only_loss
    assert not t.HasField("warmup_steps") and t.warmup_ratio == pytest.approx(0.1)
    assert t.lr_scheduler_kwargs.min_lr_rate == pytest.approx(0.1)
    assert not t.HasField("assistant_only_loss"), "None is unset"
    assert offloadd.job_spec({"training": {"warmup_steps": 10}}).training.warmup_steps == 10
    assert "training.warmup_steps" in problems({"training": {"warmup_steps": 2.5}})
    assert "training.warmup_steps" in problems({"training": {"warmup_steps": 0.1, "warmup_ratio": 0.2}})
    assert "training.lr_scheduler_kwargs.min_lr_ratio" in problems(
        {"training": {"lr_scheduler_kwargs": {"min_lr_ratio": 0.1}}})


def test_per_device_batch_size_auto_is_auto_find_batch_size():
    t = offloadd.job_spec({"training": {"per_device_train_batch_size": "auto", "train_batch_size": 32}}).training
    assert t.auto_find_batch_size and not t.HasField("per_device_train_batch_size") and t.train_batch_size == 32
    t = offloadd.job_spec({"training": {"auto_find_batch_size": True, "per_device_train_batch_size": 16}}).training
    assert t.auto_find_batch_size and t.per_device_train_batch_size == 16
    assert "training.per_device_train_batch_size" in problems(
        {"training": {"per_device_train_batch_size": "auto", "auto_find_batch_size": False}})
    assert "training.per_device_train_batch_size" in problems({"training": {"per_device_train_batch_size": "automatic"}})


def test_nearest_name_is_for_near_misses_only():
    names = ["learning_rate", "bf16", "fp16", "seed", "max_grad_norm"]
    assert nearest_name("learning_rat", names) == "learning_rate"
    assert nearest_name("LearningRate", names) == "learning_rate"
    assert nearest_name("max_grad_nrom", names) == "max_grad_norm"
    assert nearest_name("deepspeed", names) is None
    assert nearest_name("x", names) is None


def test_merge_keeps_the_daemons_problems_on_other_fields():
    F = offloadd.FieldViolation
    client = [F("model.path", "expected a string"), F("dataset.paths[0]", "expected a string")]
    daemon = [F("model.path", "required"), F("dataset.paths", "required"), F("output_dir", "required"),
              F("training.learning_rate", "must be in (0, 1]")]
    merged = merge_violations(client, daemon)
    assert [v.field for v in merged] == ["model.path", "dataset.paths[0]", "output_dir", "training.learning_rate"]


def test_resources_gpus_and_an_explicit_gpu_index():
    """resources: {gpus: N}; gpu_index has presence: 0 pins GPU 0, unset means any."""
    spec = offloadd.job_spec({"resources": {"gpus": 2}})
    assert spec.resources.gpus == 2 and not spec.resources.HasField("gpu_index")
    assert offloadd.job_spec({"resources": {"gpu_index": 0}}).resources.HasField("gpu_index")
    assert "resources.gpus" in problems({"resources": {"gpus": -1}})


def test_values_are_parsed_by_json_format_and_judged_by_the_daemon():
    """The SDK reads through google.protobuf.json_format: protobuf's types and ranges, no rules of
    its own. NaN and unknown enum numbers read here and are refused by the daemon
    (tests/job/job_validator_test.cc, NanUnknownEnumsNegativeSamplesAndAbsentGpusAreRefused)."""
    spec = offloadd.job_spec({"training": {"learning_rate": "NaN", "max_steps": "10", "bf16": True},
                              "dataset": {"format": 99, "paths": ["/a"]},
                              "offload": {"activations": {"layer_overrides": {"3": "recompute"}}}})
    assert spec.training.learning_rate != spec.training.learning_rate  # NaN
    assert spec.training.max_steps == 10 and spec.dataset.format == 99
    assert spec.offload.activations.layer_overrides[3] == job_pb2.ACTIVATION_MODE_RECOMPUTE
    got = problems({"resources": {"gpus": -1, "gpu_index": 2**40}, "display_name": 5,
                    "training": {"bf16": "yes"}})
    assert got["resources.gpus"] == "Value out of range: -1"
    assert "out of range" in got["resources.gpu_index"]
    assert "got 'int'" in got["display_name"]
    assert "true or false" in got["training.bf16"]
    # An unknown key is an error naming it, nested or not.
    assert "unknown field" in problems({"offload": {"aio": {"block": 1}}})["offload.aio.block"]
