"""The house rules that a tool can check (../shared/STYLE.md, the brief's Standards), enforced in CI:

- layering: each component includes only the components below it (ALLOWED); a new edge must be
  added here on purpose, with the reason in review;
- the daemon and the executor never include each other: they meet in job/ (NEVER);
- torch-free components include no LibTorch header, directly or through another component's
  header (the daemon must build and run without the model runtime's headers);
- file length: sources stay under 800 lines; the files already over it are listed with their
  current length and may only shrink.
"""
import pathlib
import re

import os

import pytest

# Not conftest's: the full suite has several conftest modules, and "from conftest import" binds
# whichever was imported first.
SOURCE_DIR = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))

SOURCES = (".cc", ".h", ".cu", ".inc")
ALLOWED = {
    "common": set(),
    "proto": set(),
    # The value rules of a job spec that the daemon's validation and `offloadctl convert` share.
    "jobspec": {"common", "proto"},
    "ipc": {"common"},
    "text": {"common"},
    "engine": {"common", "text"},
    "workers": {"common", "ipc"},
    "storage": {"common", "ipc"},
    "lsp": {"common", "engine", "workers"},
    # The torch-free description and pricing of a job, which the daemon's validation and the
    # trainer both read: its checks, its TrainConfig, the step planner, the host memory it needs,
    # and the daemon <-> executor protocol that carries it. It never includes trainer/ (PENDING
    # names the headers still to be cut).
    "job": {"common", "engine", "ipc", "jobspec", "proto", "text", "workers"},
    # trainer/'s sub-folders (trainer/README.md): plan never includes pipeline or state, state never
    # includes pipeline, and none of them includes the step loop above them (trainer/).
    "trainer/plan": {"common", "engine", "job", "workers"},
    "trainer/pipeline": {"common", "engine", "ipc", "job", "lsp", "storage", "trainer/plan",
                         "workers"},
    "trainer/state": {"common", "engine", "job"},
    # The step loop that wires plan, pipeline and state.
    "trainer": {"common", "engine", "ipc", "job", "lsp", "storage", "text", "trainer/pipeline",
                "trainer/plan", "trainer/state", "workers"},
    # The executor runs a job for the daemon: it reads the job and speaks the protocol through
    # job/, never through the daemon; the daemon never includes executor/ (it starts the binary).
    "executor": {"common", "engine", "ipc", "job", "jobspec", "lsp", "proto", "storage", "text",
                 "trainer", "trainer/state", "workers"},
    "daemon": {"common", "engine", "ipc", "job", "jobspec", "proto", "text", "workers"},
    "client": {"common", "jobspec", "proto"},
    # The trainer's programs sit on top of everything: offloadd-train reads a job file along the
    # daemon's path (client/cpp/job_file.h's reader, job/ validation and configuration, the daemon's
    # node probe, the executor's GPU probe), in a torch-free library of its own
    # (train/job_file_config.h).
    "train": {"client", "common", "daemon", "engine", "executor", "ipc", "job", "jobspec", "lsp",
              "proto", "storage", "text", "trainer", "trainer/pipeline", "trainer/plan",
              "trainer/state", "workers"},
}
# Sub-folders checked as components of their own, not as part of the folder above them.
SUBCOMPONENTS = [c for c in ALLOWED if "/" in c]
# Includes across an edge that ALLOWED does not have, each kept until the split that removes it
# (docs/DEVELOPING.md, "trainer/ in three sub-folders"): {(component, header): why it is still
# there}. Only these headers may cross, and test_pending_includes_are_still_there drops an entry
# as soon as its include is gone.
PENDING = {
    ("job", "trainer/state/checkpoint.h"):
        "the checkpoint's read side (CheckpointReader, LatestCheckpoint, RemoveCheckpoints) is "
        "declared beside its writer",
    ("trainer/plan", "trainer/trainer_impl.h"):
        "trainer_plan.cc and trainer_profile.cc are Trainer::Impl's methods until DevicePlanner",
    ("trainer/pipeline", "trainer/trainer_impl.h"):
        "trainer_parallel.cc is Trainer::Impl's methods until the data-parallel group has an owner",
    ("trainer/pipeline", "trainer/trainer.h"):
        "step_accounting.h reports through TrainObserver, declared with Trainer",
    ("trainer/pipeline", "trainer/state/checkpoint.h"):
        "step_accounting.h keeps the loss history as checkpoint LogEntry rows; trainer_parallel.cc "
        "reads a checkpoint for the group's followers",
    ("trainer/state", "trainer/trainer_impl.h"):
        "trainer_state.cc is Trainer::Impl's checkpoint and export methods",
}
GENERATED = {"offloadd": "proto"}  # "offloadd/v1/...": the protobuf/gRPC code generated from proto/
TORCH_FREE = ("common", "proto", "jobspec", "ipc", "text", "workers", "storage", "job", "daemon", "client")
TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*<(ATen|torch|c10|caffe2)/', re.M)
PROJECT_INCLUDE = re.compile(r'^\s*#\s*include\s*"(([a-z_0-9]+)/[^"]+)"', re.M)
MAX_LINES = 800
OVER_LIMIT: dict = {}  # files allowed past MAX_LINES for now: {path: its length}


def _files(component):
    root = SOURCE_DIR / component
    inner = [SOURCE_DIR / c for c in SUBCOMPONENTS if c.startswith(component + "/")]
    return sorted(p for p in root.rglob("*") if p.suffix in SOURCES and p.is_file()
                  and not any(d in p.parents for d in inner))


def _includes(path):
    return PROJECT_INCLUDE.findall(path.read_text(errors="replace"))


def _component_of(header, top):
    """The component a project include belongs to: its sub-folder when that is one of
    SUBCOMPONENTS ("trainer/plan/x.h" -> "trainer/plan"), else its top folder."""
    inner = [c for c in SUBCOMPONENTS if header.startswith(c + "/")]
    return max(inner, key=len) if inner else GENERATED.get(top, top)


@pytest.mark.parametrize("component", sorted(ALLOWED))
def test_components_include_only_the_layers_below(component):
    bad = []
    for f in _files(component):
        for header, top in _includes(f):
            comp = _component_of(header, top)
            if comp not in ALLOWED:  # third-party ("google/rpc/...", "grpc/health/...")
                continue
            if comp != component and comp not in ALLOWED[component] and (
                    (component, header) not in PENDING):
                bad.append(f"{f.relative_to(SOURCE_DIR)} includes {header}")
    assert not bad, "\n".join(bad)


def test_a_sub_folder_is_its_own_component():
    assert _component_of("trainer/plan/node_profile.h", "trainer") == "trainer/plan"
    assert _component_of("trainer/trainer_impl.h", "trainer") == "trainer"
    assert _component_of("train/train_args.h", "train") == "train"
    assert _component_of("offloadd/v1/job.pb.h", "offloadd") == "proto"


# The trainer's sub-folders as docs/DEVELOPING.md plans them: planning never depends on the
# pipeline or on persistent state, state never on the pipeline, and job/ never on the trainer.
NEVER_TRAINER = [("trainer/plan", "trainer/pipeline"), ("trainer/plan", "trainer/state"),
                 ("trainer/state", "trainer/pipeline"), ("job", "trainer"),
                 ("job", "trainer/plan"), ("job", "trainer/pipeline"), ("job", "trainer/state"),
                 ("daemon", "trainer")]


@pytest.mark.parametrize("component,above", NEVER_TRAINER)
def test_the_trainers_sub_folders_keep_their_direction(component, above):
    assert above not in ALLOWED[component], f"{component} may not include {above}/"


@pytest.mark.parametrize("sub", ["trainer/plan", "trainer/pipeline", "trainer/state"])
def test_the_trainers_sub_folders_never_include_the_step_loop(sub):
    assert "trainer" not in ALLOWED[sub], f"{sub} may not include the step loop above it"


def test_pending_includes_are_still_there():
    """An entry of PENDING whose include is gone is dropped, so the list only shrinks."""
    for (component, header), why in PENDING.items():
        assert why and (SOURCE_DIR / header).is_file(), f"{header} is gone: drop it from PENDING"
        used = any(header == h for f in _files(component) for h, _ in _includes(f))
        assert used, f"{component} no longer includes {header}: drop it from PENDING"


def _pulls_torch(header, seen):
    """Whether a project header includes a LibTorch header, directly or through project headers."""
    if header in seen:
        return None
    seen.add(header)
    path = SOURCE_DIR / header
    if not path.is_file():  # generated (proto) or third-party
        return None
    text = path.read_text(errors="replace")
    if TORCH_INCLUDE.search(text):
        return [header]
    for sub, _ in PROJECT_INCLUDE.findall(text):
        chain = _pulls_torch(sub, seen)
        if chain:
            return [header] + chain
    return None


# Edges that must never be allowed, whatever else ALLOWED gains: the daemon and its executor meet
# only in job/ (the job and the protocol), and neither the daemon nor job/ loads the model runtime.
NEVER = [("daemon", "executor"), ("executor", "daemon"), ("job", "daemon"), ("job", "executor")]


@pytest.mark.parametrize("component,below", NEVER)
def test_the_daemon_and_the_executor_meet_only_in_job(component, below):
    assert below not in ALLOWED[component], f"{component} may not include {below}/"


def test_the_daemon_and_the_job_are_torch_free():
    assert {"daemon", "job"} <= set(TORCH_FREE)


@pytest.mark.parametrize("component", TORCH_FREE)
def test_torch_free_components_include_no_libtorch_header(component):
    bad = []
    for f in _files(component):
        if TORCH_INCLUDE.search(f.read_text(errors="replace")):
            bad.append(f"{f.relative_to(SOURCE_DIR)} includes a LibTorch header")
            continue
        for header, _ in _includes(f):
            chain = _pulls_torch(header, set())
            if chain:
                bad.append(f"{f.relative_to(SOURCE_DIR)} -> " + " -> ".join(chain))
    assert not bad, "\n".join(bad)


def test_source_files_stay_under_800_lines():
    bad = []
    for component in list(ALLOWED) + ["bench", "fuzz", "tests"]:
        for f in _files(component):
            rel = str(f.relative_to(SOURCE_DIR))
            n = len(f.read_text(errors="replace").splitlines())
            limit = OVER_LIMIT.get(rel, MAX_LINES)
            if n > limit:
                bad.append(f"{rel}: {n} lines (limit {limit})")
    assert not bad, "\n".join(bad)


def test_the_over_limit_list_names_real_files():
    for rel in OVER_LIMIT:
        assert (SOURCE_DIR / rel).is_file(), f"{rel} is gone: drop it from OVER_LIMIT"


ISSUE_REF = re.compile(r"issue #\d")
ISSUE_REF_SUFFIXES = SOURCES + (".py", ".proto", ".sh", ".md", ".txt", ".cmake")


def test_no_issue_numbers_in_code_or_docs():
    """Code and docs say what a thing does and why, not which ticket asked for it: an "issue #N"
    rots once the tracker moves, and one reached a user-facing message. bench/RESULTS.md, a dated
    log of measurements, may name the work it measured."""
    bad = []
    for p in sorted(SOURCE_DIR.rglob("*")):
        rel = p.relative_to(SOURCE_DIR)
        if (rel.parts[0].startswith(("build", ".")) or p.suffix not in ISSUE_REF_SUFFIXES
                or p.name == "RESULTS.md" or not p.is_file()):
            continue
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if ISSUE_REF.search(line):
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)
