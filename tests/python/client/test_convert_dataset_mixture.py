"""offloadctl convert maps the alignment-handbook's dataset_mixture onto dataset.datasets when its
ids are local JSON Lines files: the handbook keeps the fraction `weight` of each dataset and
concatenates them, so each dataset's job weight is fraction x records (docs/datasets.md)."""

import json
import subprocess

import yaml


def ctl(binary_dir, *args):
    return subprocess.run([str(binary_dir / "client" / "offloadctl"), *args], capture_output=True,
                          text=True, timeout=120)


def recipe(tmp_path, entries):
    lines = ["dataset_mixture:", "  datasets:"]
    for path, weight in entries:
        lines += [f"    - id: {path}", "      columns: [messages]"]
        if weight is not None:
            lines.append(f"      weight: {weight}")
    lines += ["  seed: 0", "learning_rate: 2.0e-05", "max_steps: 3"]
    (tmp_path / "recipe.yaml").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "recipe.yaml")


def records(path, n):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": str(i)}]}) + "\n"
                            for i in range(n)) + "\n")
    return path


def test_local_mixture_weights_become_fraction_times_records(binary_dir, tmp_path):
    a, b = records(tmp_path / "a.jsonl", 6), records(tmp_path / "b.jsonl", 8)
    r = ctl(binary_dir, "convert", recipe(tmp_path, [(a, 0.5), (b, None)]), "--model", str(tmp_path),
            "--output-dir", str(tmp_path / "out"), "-o", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["missing"] == [], report
    job = yaml.safe_load(report["job_yaml"])
    assert job["dataset"]["datasets"] == [{"paths": [str(a)], "weight": 3},
                                          {"paths": [str(b)], "weight": 8}], job["dataset"]
    assert "paths" not in job["dataset"]
    assert job["dataset"]["format"] == "messages"
    # All weights 1: the handbook concatenates the datasets whole, as dataset.paths does.
    r = ctl(binary_dir, "convert", recipe(tmp_path, [(a, 1.0), (b, 1)]), "--model", str(tmp_path),
            "--output-dir", str(tmp_path / "out"), "-o", "json")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(json.loads(r.stdout)["job_yaml"])["dataset"]["paths"] == [str(a), str(b)]


def test_mixture_weights_that_cannot_be_mapped_exit_6_naming_the_entry(binary_dir, tmp_path):
    a = records(tmp_path / "a.jsonl", 4)
    shards = tmp_path / "shards"
    shards.mkdir()
    for entries, words in [([(a, 0.5), (shards, 1)], "is not a regular file"),
                           ([(a, 1.5), (a, 1)], "weight '1.5': the handbook's weight is a fraction")]:
        r = ctl(binary_dir, "convert", recipe(tmp_path, entries), "--model", str(tmp_path),
                "--output-dir", str(tmp_path / "out"))
        assert r.returncode == 6, r.stdout + r.stderr
        assert "dataset_mixture.datasets[" in r.stderr and words in r.stderr, r.stderr
