"""The shipped alert rules (deploy/prometheus/offloadd-alerts.yml) pass `promtool check rules` and
their unit tests (offloadd-alerts.test.yml), the shipped scrape config loads them, they read only
series that the shipped scrape config scrapes (the daemon's /metrics, or node_exporter's for host
memory), and every `offloadctl` command they tell an operator to run exists."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE / "offloadd-alerts.test.yml"
# Host memory: offloadd exports none, so that alert reads node_exporter's.
NODE_EXPORTER = {"node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes"}
PROMQL_WORDS = {"up", "absent", "delta", "increase", "max", "sum", "by", "on", "unless", "and", "or"}
# What the daemon's /metrics serves (the "offloadd" scrape job): its own declarations and common/'s.
# The offloadd-store, worker and executor processes serve no endpoint that the scrape config
# reaches; what of theirs an alert needs, the daemon re-exports.
SOURCE_DIRS = ("daemon", "common")


def rules_path(source_dir: pathlib.Path) -> pathlib.Path:
    return source_dir / "deploy" / "prometheus" / "offloadd-alerts.yml"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package 'prometheus', in scripts/setup.sh)")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_check_rules(source_dir):
    r = run(promtool(), "check", "rules", str(rules_path(source_dir)))
    assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests(source_dir):
    # The tests name the rules relative to themselves: they must be the shipped file.
    rule_files = yaml.safe_load(TESTS.read_text())["rule_files"]
    assert [(TESTS.parent / f).resolve() for f in rule_files] == [rules_path(source_dir).resolve()]
    r = run(promtool(), "test", "rules", str(TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_unit_test(source_dir):
    alerts = {rule["alert"] for group in yaml.safe_load(rules_path(source_dir).read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    tested_firing = {case["alertname"] for test in yaml.safe_load(TESTS.read_text())["tests"]
                     for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    tested_silent = {case["alertname"] for test in yaml.safe_load(TESTS.read_text())["tests"]
                     for case in test.get("alert_rule_test", []) if not case.get("exp_alerts")}
    assert alerts, "no alerts found"
    assert alerts <= tested_firing, f"never tested firing: {sorted(alerts - tested_firing)}"
    assert alerts <= tested_silent, f"never tested silent: {sorted(alerts - tested_silent)}"


def test_scrape_config_loads_the_rules(source_dir):
    config = source_dir / "deploy" / "prometheus" / "offloadd.yml"
    assert "offloadd-alerts.yml" in yaml.safe_load(config.read_text())["rule_files"]
    r = run(promtool(), "check", "config", str(config))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "offloadd-alerts.yml" in r.stdout + r.stderr


def test_rules_name_declared_metrics(source_dir):
    """A misspelt metric name makes an alert that never fires, which promtool cannot see."""
    declared = set()
    for d in SOURCE_DIRS:
        for f in (source_dir / d).rglob("*.cc"):
            declared.update(re.findall(r'"((?:offloadd|process)_[a-z0-9_]+)"', f.read_text(errors="replace")))
    assert "offloadd_jobs" in declared and "offloadd_job_store_requests_total" in declared, \
        "declarations not found"
    for group in yaml.safe_load(rules_path(source_dir).read_text())["groups"]:
        for rule in group["rules"]:
            expr = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"', "", rule["expr"])
            for name in re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*\b", expr):
                if name in PROMQL_WORDS or name in ("job", "instance"):
                    continue
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert name in declared or base in declared or name in NODE_EXPORTER, \
                    f"{rule['alert']}: {name} is not a metric on the daemon's /metrics"


def test_commands_named_by_alerts_exist(source_dir):
    """An annotation telling an operator to run `offloadctl describe` is wrong while no such
    command exists."""
    cli = (source_dir / "client" / "offloadctl" / "cli.cc").read_text()
    commands = set(re.findall(r'Command\(\s*app,\s*o,\s*"([a-z-]+)"', cli))
    assert {"get", "list", "describe", "logs"} <= commands, sorted(commands)
    named = []
    for group in yaml.safe_load(rules_path(source_dir).read_text())["groups"]:
        for rule in group["rules"]:
            for text in rule.get("annotations", {}).values():
                named += [(rule["alert"], c) for c in re.findall(r"`offloadctl\s+([a-z-]+)", text)]
    assert named, "no alert names an offloadctl command"
    for alert, command in named:
        assert command in commands, f"{alert} tells operators to run `offloadctl {command}`, which does not exist"
