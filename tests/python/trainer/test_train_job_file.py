"""offloadd-train reads a job file as the daemon does (`offloadd-train job.yaml [--set KEY=VALUE]`),
and the flags override what it gives."""

import pytest

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("jobfile")
    model = build_model(d / "model")
    data = write_pretokenized(d / "data.jsonl")
    spec = d / "job.yaml"
    spec.write_text(f"""
model: {{path: {model}}}
dataset: {{paths: [{data}], format: pretokenized, max_seq_length: 64}}
training: {{learning_rate: 1e-3, per_device_train_batch_size: 4, max_steps: 3, seed: 7,
           warmup_steps: 1, weight_decay: 0.01}}
output_dir: {d / "out"}
""")
    return model, data, spec, d


def test_job_file_trains_as_the_same_job_given_in_flags(binary_dir, job):
    """The job file and the flags that say the same give bit-identical losses: one job, two ways."""
    model, data, spec, d = job
    run_train(binary_dir, [str(spec), "--workers=1x1", "--no-export", f"--stats-jsonl={d / 'file.jsonl'}",
                           f"--output-dir={d / 'out-file'}"])
    run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized",
                           "--max-seq-length=64", "--lr=1e-3", "--batch-size=4", "--max-steps=3",
                           "--seed=7", "--warmup-steps=1", "--weight-decay=0.01", "--speculate=never",
                           "--workers=1x1", "--no-export", f"--stats-jsonl={d / 'flags.jsonl'}",
                           f"--output-dir={d / 'out-flags'}"])
    from_file = [r["loss"] for r in read_stats(d / "file.jsonl")]
    from_flags = [r["loss"] for r in read_stats(d / "flags.jsonl")]
    assert len(from_file) == 3
    assert from_file == from_flags


def test_set_and_flags_override_the_job_file(binary_dir, job):
    _, _, spec, d = job
    r = run_train(binary_dir, [str(spec), "--set", "training.max_steps=2", "--workers=1x1",
                               "--no-export", f"--output-dir={d / 'out-set'}"])
    assert "step 2/2" in r.stdout and "step 3/" not in r.stdout, r.stdout
    # A flag given after --set wins over it and over the file.
    r = run_train(binary_dir, [str(spec), "--set=training.max_steps=2", "--max-steps=1",
                               "--workers=1x1", "--no-export", f"--output-dir={d / 'out-flag'}"])
    assert "step 1/1" in r.stdout, r.stdout


@pytest.mark.parametrize("extra,message", [
    (["--set", "training.max_stepz=3"],
     "--set training.max_stepz: training has no field 'max_stepz' (its fields: "),
    (["--set", "trainingmax_steps"], "--set trainingmax_steps: expected KEY=VALUE"),
    (["--set", "training.max_steps.x=1"], "--set training.max_steps.x: training.max_steps has no fields"),
    # Typed by the proto field, with the job file reader's messages.
    (["--set", "training.max_steps=many"], "training.max_steps"),
    (["--set", "offload.offload_optimizer.device=floppy"], "offload.offload_optimizer.device"),
    # The daemon's validation, with its field paths.
    (["--set", "training.learning_rate=7"], "training.learning_rate: must be in (0, 1], got 7"),
    (["--set", "output_dir="], "output_dir: required"),
    (["extra.yaml"], "unexpected argument 'extra.yaml'"),
])
def test_bad_job_files_are_refused_naming_the_field(binary_dir, job, extra, message):
    _, _, spec, _ = job
    r = run_train(binary_dir, [str(spec), *extra, "--workers=1x1"], check=False)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert "step 1/" not in r.stdout


def test_set_needs_a_job_file(binary_dir, job):
    model, data, _, _ = job
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--set", "training.max_steps=1"],
                  check=False)
    assert r.returncode == 2 and "--set overrides a job file's fields" in r.stderr, r.stderr
