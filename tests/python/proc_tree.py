"""The processes below a daemon: its helper processes (offloadd-worker,
offloadd-store) are started by the job's offloadd-executor, the daemon's child, so tests that look
for them search the whole subtree, not the daemon's direct children."""

import pathlib


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return out


def descendants_named(pid: int, name: str) -> list[int]:
    """Live (not zombie) processes below `pid` whose comm is `name` (truncated to 15 characters,
    as the kernel keeps it)."""
    found, todo = [], _children(pid)
    while todo:
        c = todo.pop()
        try:
            stat = pathlib.Path(f"/proc/{c}/stat").read_text()
        except FileNotFoundError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm == name[:15] and stat[stat.rindex(")") + 2] != "Z":
            found.append(c)
        todo += _children(c)
    return found
