"""Every file a job reads or writes goes through the one confined open
(common/safe_path.h: a descriptor of the allowed root, RESOLVE_BENEATH, never through a symlink
for writes, regular files only, with the rights of the job's user). A plain std::ifstream of the
model directory's generation_config.json copied a 0600 file from outside the roots into every
checkpoint; this check keeps any other open of a path from coming back unnoticed.

Every open-like call in the components that touch job files must be on ALLOWED below, with the
reason it does not open a job path. A new one fails CI: route it through common/safe_path.h
(OpenConfined, ReadFileConfined, WriteFileAtomically, MakeDirsConfined) or add it here on purpose,
with its reason, in review."""
import os
import pathlib
import re

SOURCE_DIR = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))

# What a job's files pass through: the executor and trainer, the model loader and exporter, the
# tokenizer, chat template and datasets, the store, the optimizer workers, LSP, and the daemon's
# validation and configuration of a job (job/, and the daemon's jobs in daemon/jobs).
# common/safe_path.cc is the confined open itself.
SCANNED = ("trainer", "executor", "engine", "text", "storage", "workers", "lsp", "job", "daemon/jobs")
# Operator command-line tools (offloadd-train, offloadd-plan, tokenize, dataset): they open what
# their own user names on the command line, with that user's rights.
SKIPPED_DIRS = ("tools",)

OPEN_CALL = re.compile(
    r"std::[io]?fstream\b|\bfopen\s*\(|\bfreopen\s*\(|(?<![\w.>])(?:::)?open\s*\(|\bopenat2?\s*\(|"
    r"\bcreat\s*\(|\bmkdtemp\s*\(|\bmkstemp\s*\(|(?<![\w.>])(?:::)?mkdir\s*\(|(?<![\w.>])opendir\s*\(|"
    r"\btruncate\s*\(|(?<![\w.>])(?:::)?rename\s*\(|(?<![\w.>])(?:::)?unlink\s*\(")

# Files whose every open is of a daemon path, never a job's.
ALLOWED_FILES = {
    "storage/store_dir.cc": "the NVMe store's own files in the daemon's store directories (storage.directories)",
    "storage/tensor_store.cc": "the store's manifest in the daemon's store directories",
    "daemon/jobs/job_store.cc": "the daemon's own job database (<state_dir>/jobs.db), its recreation "
    "and its -wal/-shm files; never a job path",
    "job/host_memory.cc": "the node's memory facts: /proc/meminfo, /proc/self/status, "
    "/proc/self/cgroup and the cgroup's memory.max / memory.current under /sys/fs/cgroup; never a "
    "job path",
}

# (file, a piece of the line): why it is not a job path, or how it stays confined.
ALLOWED = {
    ("trainer/plan/node_profile.cc", 'std::ifstream in("/proc/cpuinfo")'): "a /proc file",
    ("trainer/plan/node_profile.cc", "open(path.c_str(), flags | O_DIRECT, 0600)"):
        "node profile scratch file in a daemon store directory (storage.directories), not a job path",
    ("trainer/plan/node_profile.cc", "open(path.c_str(), flags, 0600)"): "the same scratch file without O_DIRECT",
    ("trainer/plan/node_profile.cc", "unlink(path.c_str())"): "removes that scratch file",
    ("trainer/pipeline/host_optimizer_group.cc", "open(o.leader_arena_path.c_str()"):
        "the leader's shared-memory arena (/dev/shm), created by the job's own executor",
    ("trainer/trainer_hosts.cc", "open(path.c_str(), O_RDWR | O_CLOEXEC)"):
        "the host leader's whole weights, a shared segment of the job's own executor opened as "
        "/proc/<leader pid>/fd/<n> (the path comes from the group's store), not a job path",
    ("trainer/pipeline/group_link.cc", "open(path.c_str(), O_RDWR | O_CLOEXEC)"):
        "the data-parallel group's shared segment in the daemon's rendezvous directory (state_dir)",
    ("job/shape_profile.cc", "opendir(sub.c_str())"):
        "the daemon's profile cache (<state_dir>/profiles/shapes), not a job path",
    ("trainer/state/checkpoint_files.cc", "::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW"):
        "a new file in a checkpoint directory opened through the confined output_dir descriptor",
    ("trainer/state/checkpoint.cc", "::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW"):
        "a checkpoint directory under the confined output_dir descriptor, never through a symlink",
    ("trainer/pipeline/activation_spill.cc", "::mkdir(prefix.c_str(), 0750)"):
        "activation spill directories in the daemon's store directories (storage.directories)",
    ("job/train_job_config.cc", "opendir(model_dir.c_str())"):
        "lists the model's file names and sizes (fstatat, no symlink followed) for the free-space estimate; "
        "opens no file",
    ("workers/cpu_topology.cc", "opendir(sys_root.c_str())"): "/sys CPU topology",
    ("workers/cpu_topology.cc", "std::ifstream in(sys_root"): "/sys CPU topology",
}


def _sources():
    for top in SCANNED:
        for p in sorted((SOURCE_DIR / top).rglob("*")):
            if p.suffix not in (".cc", ".h") or not p.is_file():
                continue
            if any(part in SKIPPED_DIRS for part in p.relative_to(SOURCE_DIR).parts):
                continue
            yield p


def _code(line: str) -> str:
    """The line without its // comment and string literals' contents (a message naming 'open')."""
    line = line.split("//", 1)[0]
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)


def find_unlisted_opens():
    found, used = [], set()
    for p in _sources():
        rel = p.relative_to(SOURCE_DIR).as_posix()
        if rel in ALLOWED_FILES:
            continue
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if not OPEN_CALL.search(_code(line)):
                continue
            key = next((k for k in ALLOWED if k[0] == rel and k[1] in line), None)
            if key is None:
                found.append(f"{rel}:{n}: {line.strip()}")
            else:
                used.add(key)
    return found, used


def test_every_open_of_a_job_path_goes_through_the_confined_open():
    found, _ = find_unlisted_opens()
    assert not found, (
        "opens outside common/safe_path.h (route them through OpenConfined / ReadFileConfined / "
        "WriteFileAtomically / MakeDirsConfined, or list them in ALLOWED with the reason they are not "
        "job paths):\n  " + "\n  ".join(found))


def test_the_allow_list_has_no_stale_entries():
    _, used = find_unlisted_opens()
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match no line any more (remove them): {stale}"


def test_the_check_catches_the_ifstream_of_issue_29(tmp_path, monkeypatch):
    # The scanner itself: the call that copied files from outside the roots is caught.
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.cc").write_text('  std::ifstream in(path, std::ios::binary);  // "open("\n'
                                               '  const int fd = ::open(tmp.c_str(), O_WRONLY);\n'
                                               '  Log("cannot open(2) it");\n')
    monkeypatch.setattr(__import__(__name__), "SOURCE_DIR", tmp_path)
    found, _ = find_unlisted_opens()
    assert [f.split(":")[1] for f in found] == ["1", "2"], found
