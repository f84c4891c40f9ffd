"""Issue #16 item 2: the Debian package installed the way an administrator installs it, into a fresh
Debian root made from Debian's own packages (debootstrap, the release and mirror of this machine's
apt sources), and run there:
  - `apt-get install ./offloadd_*.deb` resolves the Depends from the mirror and runs the maintainer
    scripts debhelper wrote, which create the `offloadd` user and its directories
    (dh_installsysusers, dh_installtmpfiles);
  - `systemd-analyze verify` passes on the installed unit;
  - the daemon starts exactly as the unit's ExecStartPre/ExecStart lines say, as the `offloadd` user
    and group, on the installed configuration changed only in the paths this test needs, with the
    runtime directory systemd would make (RuntimeDirectory=offloadd, 0750);
  - the demo job is submitted with the installed offloadctl and with the Python SDK installed from
    the packaged wheel into a virtualenv (its dependencies from PyPI at their declared floors), and
    both succeed and export a model.
systemd itself does not run in a chroot (no PID 1), so `systemctl` is not exercised.

Needs root (chroot, mounts), debootstrap, and the Debian mirror and PyPI reachable: skipped with the
reason otherwise. OFFLOADD_FRESH_ROOT_KEEP=1 leaves the root in place for inspection."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deb_testlib import EXAMPLES, SOURCE, run  # noqa: E402

DEMO_STEPS = int(os.environ.get("OFFLOADD_PACKAGING_DEMO_STEPS", "10"))


def apt_source() -> tuple[str, str]:
    """(suite, mirror) of this machine's first Debian apt source."""
    texts = []
    for p in [pathlib.Path("/etc/apt/sources.list"), *sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*"))]:
        if p.is_file():
            texts.append(p.read_text())
    text = "\n".join(texts)
    m = re.search(r"^URIs:\s*(\S+).*?^Suites:\s*(\S+)", text, re.M | re.S)  # deb822
    if m:
        return m.group(2), m.group(1)
    m = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", text, re.M)
    if m:
        return m.group(2), m.group(1)
    pytest.skip("no Debian apt source found in /etc/apt")


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            return r.status == 200
    except OSError:
        return False


def chroot(root: pathlib.Path, *cmd, user: str | None = None, timeout: float = 600, env: dict | None = None):
    args = ["chroot"] + ([f"--userspec={user}"] if user else []) + [str(root), *[str(c) for c in cmd]]
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive",
            "HOME": "/root"}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})


@pytest.fixture(scope="module")
def fresh_root(deb, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root (chroot and mounts)")
    if not shutil.which("debootstrap"):
        pytest.skip("debootstrap not installed (Debian package 'debootstrap', in scripts/setup.sh)")
    suite, mirror = apt_source()
    if not reachable(f"{mirror.rstrip('/')}/dists/{suite}/Release"):
        pytest.skip(f"the Debian mirror {mirror} ({suite}) is not reachable")
    root = tmp_path_factory.mktemp("fresh-root")
    t0 = time.monotonic()
    r = run(["debootstrap", "--variant=minbase", "--include=systemd,python3,python3-venv,ca-certificates",
             suite, root, mirror], timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    os.chmod(root, 0o755)  # "/" of the root: pytest made it 0700, which the offloadd user could not enter
    print(f"debootstrap {suite} from {mirror}: {time.monotonic() - t0:.0f} s")
    mounts = []
    try:
        for kind, src, dst in [("proc", "proc", "proc"), ("bind", "/dev", "dev"), ("bind", "/dev/shm", "dev/shm"),
                               ("bind", "/sys", "sys")]:
            target = root / dst
            target.mkdir(parents=True, exist_ok=True)
            cmd = ["mount", "-t", "proc", src, target] if kind == "proc" else ["mount", "--bind", src, target]
            r = run(cmd)
            assert r.returncode == 0, r.stderr
            mounts.append(target)
        # The host's own trust and pip settings (a local CA, an index mirror), as its admin would have.
        local_cas = sorted(pathlib.Path("/usr/local/share/ca-certificates").glob("*.crt"))
        for ca in local_cas:
            shutil.copy(ca, root / "usr/local/share/ca-certificates" / ca.name)
        if local_cas:
            r = chroot(root, "update-ca-certificates")
            assert r.returncode == 0, r.stdout + r.stderr
        if pathlib.Path("/etc/pip.conf").is_file():
            shutil.copy("/etc/pip.conf", root / "etc/pip.conf")
        shutil.copy(deb, root / "tmp" / deb.name)
        t0 = time.monotonic()
        r = chroot(root, "apt-get", "install", "-y", "--no-install-recommends", f"/tmp/{deb.name}", timeout=1800)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        print(f"apt-get install ./{deb.name}: {time.monotonic() - t0:.0f} s")
        yield root
    finally:
        for target in reversed(mounts):
            run(["umount", "-l", target])
        # Never remove through a mount still in place: that would be the host's /dev or /sys.
        still = [str(t) for t in mounts if os.path.ismount(t)]
        if still:
            print(f"left {root} in place: still mounted {still}")
        elif not os.environ.get("OFFLOADD_FRESH_ROOT_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


def test_apt_install_creates_the_service_user_and_directories(fresh_root):
    r = chroot(fresh_root, "getent", "passwd", "offloadd")
    assert r.returncode == 0, "postinst did not create the offloadd user"
    fields = r.stdout.strip().split(":")
    assert fields[5] == "/var/lib/offloadd" and fields[6] == "/usr/sbin/nologin", fields
    groups = chroot(fresh_root, "id", "-nG", "offloadd").stdout.split()
    assert {"offloadd", "video", "render"} <= set(groups), groups
    st = os.stat(fresh_root / "var/lib/offloadd/store")
    assert (st.st_mode & 0o777) == 0o750
    owner = chroot(fresh_root, "stat", "-c", "%U:%G", "/var/lib/offloadd").stdout.strip()
    assert owner == "offloadd:offloadd"
    r = chroot(fresh_root, "dpkg-query", "-W", "-f", "${Status}", "offloadd")
    assert r.stdout == "install ok installed", r.stdout


def test_systemd_analyze_verifies_the_installed_unit(fresh_root):
    r = chroot(fresh_root, "systemd-analyze", "verify", "/usr/lib/systemd/system/offloadd.service")
    assert r.returncode == 0, r.stdout + r.stderr
    # Not even a warning about the unit itself.
    assert "offloadd.service" not in r.stderr, r.stderr


class ServiceInChroot:
    """The unit's ExecStartPre/ExecStart run in the root as User=/Group= offloadd, with the runtime
    directory RuntimeDirectory= makes, on the installed config with only its paths changed."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        config = root / "etc/offloadd/offloadd.yaml"
        cfg = yaml.safe_load(config.read_text())
        cfg["allowed_roots"] = ["/srv/offloadd-demo"]
        cfg["metrics"]["listen"] = "127.0.0.1:0"  # the host's port 9464 may be taken
        config.write_text(yaml.safe_dump(cfg))
        self.socket = cfg["server"]["unix_socket"]
        run_dir = root / "run/offloadd"
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(run_dir, 0o750)
        assert chroot(root, "chown", "offloadd:offloadd", "/run/offloadd").returncode == 0
        unit = (root / "usr/lib/systemd/system/offloadd.service").read_text()
        self.pre, self.start_cmd = (re.search(rf"^{k}=(.*)$", unit, re.M).group(1).split()
                                    for k in ("ExecStartPre", "ExecStart"))
        self.proc = None

    def start(self) -> "ServiceInChroot":
        r = chroot(self.root, *self.pre, user="offloadd:offloadd")
        assert r.returncode == 0, r.stdout + r.stderr
        notify = self.root / "run/notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        os.chmod(notify, 0o777)
        sock.settimeout(120)
        self.log = open(self.root / "tmp/offloadd.log", "wb")
        self.proc = subprocess.Popen(["chroot", "--userspec=offloadd:offloadd", str(self.root), *self.start_cmd],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env={"PATH": "/usr/sbin:/usr/bin", "NOTIFY_SOCKET": "/run/notify.sock",
                                          "LANG": "C.UTF-8"})
        try:
            while "READY=1" not in sock.recv(4096).decode():
                pass
        except socket.timeout:
            self.stop()
            raise AssertionError("offloadd in the fresh root not ready:\n" + self.log_text())
        finally:
            sock.close()
        return self

    def log_text(self) -> str:
        return (self.root / "tmp/offloadd.log").read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=90)
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def demo_inputs(fresh_root):
    """The README's demo model and dataset, under the configured allowed root, readable by offloadd."""
    demo = fresh_root / "srv/offloadd-demo"
    (demo / "out").mkdir(parents=True, exist_ok=True)
    src = EXAMPLES / "stories260K"
    r = run([sys.executable, SOURCE / "scripts/convert_llama2c.py", "--model", src / "stories260K.bin",
             "--tokenizer", src / "tok512.bin", "--out", demo / "stories260K"])
    assert r.returncode == 0, r.stderr
    shutil.copy(EXAMPLES / "alpaca/alpaca_300.json", demo / "alpaca.json")
    assert chroot(fresh_root, "chown", "-R", "offloadd:offloadd", "/srv/offloadd-demo").returncode == 0
    return demo


def demo_job(root: pathlib.Path, name: str) -> str:
    path = f"/srv/offloadd-demo/{name}.yaml"
    (root / path.lstrip("/")).write_text(
        f"display_name: {name}\n"
        "model: {path: /srv/offloadd-demo/stories260K}\n"
        "dataset: {paths: [/srv/offloadd-demo/alpaca.json], format: alpaca, max_seq_length: 256, max_samples: 200}\n"
        f"training: {{learning_rate: 1e-3, per_device_train_batch_size: 8, max_steps: {DEMO_STEPS}, "
        f"warmup_steps: 3, logging_steps: 1, save_steps: {DEMO_STEPS}}}\n"
        f"output_dir: /srv/offloadd-demo/out/{name}\n")
    return path


@pytest.fixture(scope="module")
def service(fresh_root, demo_inputs):
    s = ServiceInChroot(fresh_root).start()
    yield s
    assert s.stop() == 0, s.log_text()


PY_SUBMIT = """\
import sys
import offloadd
from offloadd.v1 import job_pb2
with offloadd.Client(sys.argv[1]) as c:
    job = c.submit(sys.argv[2], wait=True)
    print(job_pb2.JobState.Name(job.state), job.error.message)
"""


def test_demo_job_through_the_installed_offloadctl(fresh_root, service):
    job = demo_job(fresh_root, "demo-offloadctl")
    t0 = time.monotonic()
    r = chroot(fresh_root, "offloadctl", "--target", f"unix://{service.socket}", "submit", job, "--watch",
               user="offloadd:offloadd")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + service.log_text()
    assert (fresh_root / "srv/offloadd-demo/out/demo-offloadctl/config.json").exists(), r.stdout[-2000:]
    print(f"demo job ({DEMO_STEPS} steps) in the fresh root through offloadctl: {time.monotonic() - t0:.1f} s")


def test_demo_job_through_the_packaged_python_sdk(fresh_root, service):
    if not reachable("https://pypi.org/simple/grpcio/"):
        pytest.skip("PyPI is not reachable: the SDK's dependencies cannot be installed")
    wheel = next((fresh_root / "usr/share/offloadd/python").glob("offloadd-*.whl"))
    r = chroot(fresh_root, "python3", "-m", "venv", "/opt/sdk")
    assert r.returncode == 0, r.stderr
    r = chroot(fresh_root, "/opt/sdk/bin/pip", "install", "--quiet", "--disable-pip-version-check",
               f"/usr/share/offloadd/python/{wheel.name}", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    script = fresh_root / "tmp/submit.py"
    script.write_text(PY_SUBMIT)
    job = demo_job(fresh_root, "demo-python")
    r = chroot(fresh_root, "/opt/sdk/bin/python", "/tmp/submit.py", f"unix://{service.socket}", job,
               user="offloadd:offloadd")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith("JOB_STATE_SUCCEEDED"), r.stdout + service.log_text()
    assert (fresh_root / "srv/offloadd-demo/out/demo-python/config.json").exists()
