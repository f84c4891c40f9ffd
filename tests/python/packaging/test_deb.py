"""The Debian package debhelper builds from debian/ on the build tree, checked by lintian, extracted
into a fresh root with `dpkg-deb -x` (no root needed) and used from there with LD_LIBRARY_PATH
unset: its control data (Depends derived by dpkg-shlibdeps, the conffile, the maintainer scripts
debhelper wrote), its layout (man pages, copyright, changelog), RUNPATHs that resolve inside the
package, the installed programs' --version, the daemon started as the unit's ExecStart does with the
installed configuration (only its paths changed), a find_package(offloadd) consumer built against
the installed C++ SDK, and the demo job submitted with the installed offloadctl and with the Python
SDK installed from the packaged wheel.

The package is built once per session (conftest.py; OFFLOADD_DEB names a prebuilt one)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deb_testlib import EXAMPLES, PROGRAMS, SOURCE, clean_env, run  # noqa: E402

pytestmark = pytest.mark.skipif(
    not shutil.which("dpkg-deb"), reason="dpkg-deb not found: install dpkg to test the Debian package")


def unit_path(root: pathlib.Path) -> pathlib.Path:
    """The unit where dh_installsystemd put it: /lib/systemd/system up to Debian 12, /usr/lib after
    (the same directory on a merged-/usr system)."""
    found = [p for p in (root / "usr/lib/systemd/system/offloadd.service", root / "lib/systemd/system/offloadd.service")
             if p.is_file()]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def root(deb, tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    r = run(["dpkg-deb", "-x", deb, root], timeout=600)
    assert r.returncode == 0, r.stderr
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_control_states_dependencies_and_the_conffile(deb):
    fields = {f: run(["dpkg-deb", "-f", deb, f]).stdout.strip() for f in ("Package", "Depends", "Recommends")}
    assert fields["Package"] == "offloadd"
    depends = [d.strip().split()[0] for d in fields["Depends"].split(",")]
    # What the programs link from Debian, found by dpkg-shlibdeps (not a list kept by hand).
    for pattern in [r"libgrpc\+\+\d", r"libprotobuf\d+", r"libyaml-cpp0\.\d", r"liburing\d",
                    r"libprometheus-cpp-core", r"libsqlite3-0", r"libssl3|libssl\d", r"libc6", r"libstdc\+\+6"]:
        assert any(re.fullmatch(pattern + ".*", d) for d in depends), (pattern, depends)
    # Nothing for the bundled LibTorch/CUDA libraries, nor the host's GPU driver.
    assert not [d for d in depends if re.search(r"torch|cuda|nvidia", d)], depends
    assert "systemd" in fields["Recommends"]
    ctrl = pathlib.Path(run(["mktemp", "-d"]).stdout.strip())
    try:
        assert run(["dpkg-deb", "-e", deb, ctrl]).returncode == 0
        assert (ctrl / "conffiles").read_text().split() == ["/etc/offloadd/offloadd.yaml"]
        for script in ("postinst", "prerm", "postrm"):
            assert os.access(ctrl / script, os.X_OK), script
            assert run(["sh", "-n", ctrl / script]).returncode == 0, script
        # Written by debhelper, in this order: the user before the directories it owns.
        postinst = (ctrl / "postinst").read_text()
        helpers = re.findall(r"# Automatically added by (dh_\w+)", postinst)
        assert helpers[:2] == ["dh_installsysusers", "dh_installtmpfiles"] and "dh_installsystemd" in helpers, helpers
        assert "systemd-sysusers" in postinst and "offloadd.conf" in postinst
        # Not enabled at installation (the administrator's step); stopped before removal.
        assert "deb-systemd-helper enable" not in postinst.split("was-enabled")[0]
        assert "deb-systemd-invoke stop 'offloadd.service'" in (ctrl / "prerm").read_text()
    finally:
        shutil.rmtree(ctrl)


# What scripts/setup.sh installs that no package build needs: the test, fuzz and Python-extension
# headers (the suites are not built into the package); dpkg-dev is build-essential's, implied.
NOT_FOR_THE_PACKAGE = {"libgtest-dev", "libgmock-dev", "libclang-rt-16-dev", "python3-dev", "dpkg-dev"}


def test_every_library_the_build_uses_is_a_build_dependency():
    """A clean build host (sbuild, a fresh clone's dpkg-buildpackage) installs only Build-Depends:
    each -dev package scripts/setup.sh installs for the programs must be one. libsystemd-dev and
    libsentencepiece-dev were missing (the build only passed where setup.sh had run)."""
    setup = (SOURCE / "scripts/setup.sh").read_text()
    listed = re.search(r"^apt_packages=\((.*?)^\)", setup, re.S | re.M).group(1)
    dev = {w for line in listed.splitlines() for w in line.split("#")[0].split() if w.endswith("-dev")}
    control = (SOURCE / "debian/control").read_text()
    build_depends = re.search(r"^Build-Depends:(.*?)^\S", control, re.S | re.M).group(1)
    declared = {d.strip().split()[0] for d in build_depends.replace("\n", " ").split(",") if d.strip()}
    missing = sorted(dev - NOT_FOR_THE_PACKAGE - declared)
    assert not missing, f"in scripts/setup.sh but not in debian/control's Build-Depends: {missing}"
    assert "libgloo-dev" in declared and len(dev - NOT_FOR_THE_PACKAGE) > 15, (dev, declared)


def test_overrides_are_justified():
    """Each lintian override sits under a comment that says why (a comment, then the overrides it
    justifies, then a blank line)."""
    justified = False
    for line in (SOURCE / "debian/offloadd.lintian-overrides").read_text().splitlines():
        if line.startswith("#"):
            justified = True
        elif not line.strip():
            justified = False
        else:
            assert justified, f"override without a reason above it: {line}"


def test_lintian_clean(deb):
    """No error or warning; the overrides are the package's (debian/offloadd.lintian-overrides,
    installed with it). lintian reads every bundled library's ELF tables: about 5 minutes of CPU
    (13 to 26 minutes on a loaded two-core machine) for the CUDA flavour's 3.5 GB, so a package over 1 GB
    is checked only with OFFLOADD_LINTIAN=1; OFFLOADD_LINTIAN=0 skips the check."""
    if not shutil.which("lintian"):
        pytest.skip("lintian not installed (scripts/setup.sh installs it)")
    flag = os.environ.get("OFFLOADD_LINTIAN")
    if flag == "0" or (flag != "1" and deb.stat().st_size > 1 << 30):
        pytest.skip(f"{deb.name} is {deb.stat().st_size >> 20} MiB: set OFFLOADD_LINTIAN=1 to run lintian on it")
    r = run(["lintian", "--fail-on", "error,warning", "--tag-display-limit", "0", deb], timeout=3600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert not [line for line in r.stdout.splitlines() if line[:2] in ("E:", "W:")], r.stdout


def test_layout(root):
    for p in PROGRAMS:
        assert os.access(root / "usr/bin" / p, os.X_OK), p
    for f in ["etc/offloadd/offloadd.yaml", "usr/lib/sysusers.d/offloadd.conf", "usr/lib/tmpfiles.d/offloadd.conf",
              "usr/share/offloadd/dashboards/offloadd.json", "usr/share/offloadd/prometheus/offloadd.yml",
              "usr/share/offloadd/prometheus/offloadd-alerts.yml",
              "usr/share/offloadd/grafana/provisioning/datasources/offloadd.yaml",
              "usr/include/offloadd/client/cpp/offloadd_client.h", "usr/include/offloadd/offloadd/v1/job.pb.h",
              "usr/lib/offloadd/torch/lib/libc10.so", "usr/share/doc/offloadd/copyright",
              "usr/share/doc/offloadd/changelog.gz", "usr/share/man/man8/offloadd.8.gz",
              "usr/share/man/man1/offloadctl.1.gz", "usr/share/man/man1/offloadd-train.1.gz"]:
        assert (root / f).is_file(), f
    # The C++ SDK's CMake package: lib/ or the multiarch lib/<triplet>/ (a build configured for /usr).
    assert list(root.glob("usr/lib/**/cmake/offloadd/offloaddConfig.cmake"))
    assert (root / "usr/share/doc/offloadd/copyright").read_text() == (SOURCE / "debian/copyright").read_text()
    assert list((root / "usr/share/offloadd/python").glob("offloadd-*-py3-none-any.whl"))
    unit = unit_path(root).read_text()
    doc = re.search(r"^Documentation=file://(\S+)$", unit, re.M)
    assert doc and (root / doc.group(1).lstrip("/")).is_file(), "the unit's Documentation= is not in the package"
    assert "ExecStart=/usr/bin/offloadd --config /etc/offloadd/offloadd.yaml" in unit
    # CMake's @VAR@ form; a lone @ is systemd's (SystemCallFilter=@system-service).
    assert not re.search(r"@[A-Za-z_0-9/.+-]+@", unit), "unsubstituted template variable in the unit"
    # The unit's config path is the installed one (not /usr/local/etc, not a doubled DESTDIR).
    assert not list(root.glob("usr/local/**/offloadd.yaml")) and not (root / "usr/etc").exists()


def test_runpaths_resolve_inside_the_package(root):
    for p in PROGRAMS:
        dyn = run(["readelf", "-d", root / "usr/bin" / p]).stdout
        runpath = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn)
        assert runpath, f"{p} has no RUNPATH"
        assert all(e.startswith("$ORIGIN/") for e in runpath.group(1).split(":")), (p, runpath.group(1))
        ldd = run(["ldd", root / "usr/bin" / p], env=clean_env()).stdout
        assert "not found" not in ldd, ldd
        for line in ldd.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if not m:
                continue
            where = os.path.realpath(m.group(2))
            bundled = where.startswith(str(root) + "/usr/lib/offloadd/")
            # LibTorch's and CUDA's libraries from the package; the rest from Debian's directories,
            # never from a virtualenv or /usr/local.
            if re.match(r"lib(torch|c10|cud|cublas|cupti|cusparse|cufft|curand|cusolver|nccl|nvJitLink|nvshmem|gomp)",
                        m.group(1)):
                assert bundled, line
            else:
                assert bundled or re.match(r"/(usr/)?lib/", where), line


def test_installed_programs_run(root):
    r = run([root / "usr/bin/offloadd", "--version"], env=clean_env())
    assert r.returncode == 0 and r.stdout.startswith("offloadd "), r.stdout + r.stderr
    r = run([root / "usr/bin/offloadctl", "--version"], env=clean_env())
    assert r.returncode == 0 and "offloadd" in r.stdout, r.stdout + r.stderr


class InstalledDaemon:
    """The installed offloadd started the way the unit's ExecStartPre/ExecStart lines say, on the
    installed configuration with only its paths moved into `work`; ready on sd_notify READY=1."""

    def __init__(self, root: pathlib.Path, work: pathlib.Path, readable: list[pathlib.Path]):
        cfg = yaml.safe_load((root / "etc/offloadd/offloadd.yaml").read_text())
        cfg["state_dir"] = str(work / "state")
        cfg["allowed_roots"] = [str(work)] + [str(p) for p in readable]
        cfg["server"]["unix_socket"] = str(work / "run/offloadd.sock")
        cfg["metrics"]["listen"] = "127.0.0.1:0"
        cfg["storage"]["directories"] = [dict(cfg["storage"]["directories"][0], path=str(work / "store"))]
        (work / "store").mkdir(parents=True, exist_ok=True)
        self.config = work / "offloadd.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.target = f"unix://{work / 'run/offloadd.sock'}"
        unit = unit_path(root).read_text()
        self.commands = [self._localize(root, re.search(rf"^{k}=(.*)$", unit, re.M).group(1))
                         for k in ("ExecStartPre", "ExecStart")]
        self.work = work
        self.proc = None

    def _localize(self, root: pathlib.Path, line: str) -> list[str]:
        return [str(root) + a if a.startswith("/usr/") else str(self.config) if a == "/etc/offloadd/offloadd.yaml"
                else a for a in line.split()]

    def start(self) -> "InstalledDaemon":
        r = run(self.commands[0], env=clean_env())
        assert r.returncode == 0, r.stdout + r.stderr
        notify = self.work / "notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        sock.settimeout(60)
        self.log = open(self.work / "offloadd.log", "wb")
        self.proc = subprocess.Popen(self.commands[1], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=clean_env(NOTIFY_SOCKET=str(notify)))
        try:
            while "READY=1" not in sock.recv(4096).decode():
                pass
        except socket.timeout:
            self.stop()
            raise AssertionError("installed offloadd not ready:\n" + (self.work / "offloadd.log").read_text())
        finally:
            sock.close()
        return self

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def daemon(root, tmp_path_factory):
    work = tmp_path_factory.mktemp("service")
    d = InstalledDaemon(root, work, [EXAMPLES]).start()
    yield d
    assert d.stop() == 0, (work / "offloadd.log").read_text()[-3000:]


def test_offloadctl_talks_to_the_installed_daemon(root, daemon):
    r = run([root / "usr/bin/offloadctl", "--target", daemon.target, "health"], env=clean_env())
    assert r.returncode == 0 and "SERVING" in r.stdout, r.stdout + r.stderr


CONSUMER_CMAKE = """\
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(offloadd 0.1 CONFIG REQUIRED)
add_executable(consumer main.cc)
target_link_libraries(consumer PRIVATE offloadd::client)
"""

CONSUMER_MAIN = """\
#include <iostream>

#include "client/cpp/offloadd_client.h"

int main(int argc, char** argv) {
  offloadd::client::ConnectOptions options;
  options.target = argv[1];
  auto client = offloadd::client::Client::Connect(options);
  if (!client.ok()) { std::cerr << client.status().ToString() << "\\n"; return 1; }
  auto health = (*client)->CheckHealth();
  auto node = (*client)->GetNodeInfo();
  if (!health.ok() || !node.ok()) { std::cerr << "call failed\\n"; return 1; }
  std::cout << offloadd::client::HealthStatusName(*health) << " " << node->build().version() << "\\n";
  return 0;
}
"""


def test_find_package_consumer_builds_and_calls_the_daemon(root, daemon, tmp_path):
    if not shutil.which("cmake") or not shutil.which("c++"):
        pytest.skip("cmake or c++ not found")
    (tmp_path / "src").mkdir()
    (tmp_path / "src/CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (tmp_path / "src/main.cc").write_text(CONSUMER_MAIN)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    r = run(["cmake", "-S", tmp_path / "src", "-B", tmp_path / "b", *gen, f"-DCMAKE_PREFIX_PATH={root / 'usr'}"],
            env=clean_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run(["cmake", "--build", tmp_path / "b"], timeout=600, env=clean_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run([tmp_path / "b/consumer", daemon.target], env=clean_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("SERVING 0.1.0"), r.stdout


def demo_job(work: pathlib.Path, name: str, steps: int) -> pathlib.Path:
    """The README's demo job (scripts/demo.sh), shortened to `steps` steps."""
    model = work / "models/stories260K"
    if not (model / "config.json").exists():
        src = EXAMPLES / "stories260K"
        r = run([sys.executable, SOURCE / "scripts/convert_llama2c.py", "--model", src / "stories260K.bin",
                 "--tokenizer", src / "tok512.bin", "--out", model])
        assert r.returncode == 0, r.stderr
    job = work / f"{name}.yaml"
    job.write_text(textwrap.dedent(f"""\
        display_name: {name}
        model: {{path: {model}}}
        dataset:
          paths: [{EXAMPLES / 'alpaca/alpaca_300.json'}]
          format: alpaca
          max_seq_length: 256
          max_samples: 200
        training: {{learning_rate: 1e-3, per_device_train_batch_size: 8, max_steps: {steps}, warmup_steps: 3,
                   logging_steps: 1, save_steps: {steps}, save_total_limit: 2}}
        output_dir: {work / 'out' / name}
        """))
    return job


DEMO_STEPS = int(os.environ.get("OFFLOADD_PACKAGING_DEMO_STEPS", "10"))


def test_demo_job_through_the_installed_offloadctl(root, daemon):
    job = demo_job(daemon.work, "demo-offloadctl", DEMO_STEPS)
    t0 = time.monotonic()
    r = run([root / "usr/bin/offloadctl", "--target", daemon.target, "submit", job, "--watch"], timeout=600,
            env=clean_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (daemon.work / "out/demo-offloadctl/config.json").exists(), r.stdout[-2000:]
    print(f"demo job ({DEMO_STEPS} steps) through offloadctl: {time.monotonic() - t0:.1f}s")


PY_SUBMIT = """\
import pathlib, sys
import offloadd
from offloadd.v1 import job_pb2
assert pathlib.Path(offloadd.__file__).is_relative_to(sys.argv[3]), offloadd.__file__
with offloadd.Client(sys.argv[1]) as c:
    job = c.submit(sys.argv[2], wait=True)
    print(job_pb2.JobState.Name(job.state), job.spec.output_dir)
"""


def test_demo_job_through_the_packaged_python_sdk(root, daemon, tmp_path):
    wheel = next((root / "usr/share/offloadd/python").glob("offloadd-*.whl"))
    site = tmp_path / "site"
    # Only the wheel: its dependencies (grpcio, protobuf, PyYAML) come from this interpreter's
    # environment, which has them; test_sdk_install checks the declared floors in a clean venv.
    r = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
             "--disable-pip-version-check", "--target", site, wheel])
    assert r.returncode == 0, r.stderr
    assert (site / "offloadd/v1/job_service_pb2_grpc.py").exists(), "the wheel lacks the generated stubs"
    job = demo_job(daemon.work, "demo-python", DEMO_STEPS)
    r = run([sys.executable, "-c", PY_SUBMIT, daemon.target, job, site], timeout=600,
            env=clean_env(PYTHONPATH=str(site)), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith("JOB_STATE_SUCCEEDED"), r.stdout
