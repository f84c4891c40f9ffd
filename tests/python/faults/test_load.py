"""Load: a bounded loopback test. CLIENTS concurrent clients, each on
its own channel to the daemon's Unix socket, run ROUNDS rounds of: create a job, watch it, cancel
it, and read the watch to the end. The daemon's VmRSS and open fds are sampled after every round.

Holds when: every watch sees every event of its job exactly once, with contiguous cursors from 1,
ending in the job's final state (no event lost); every job ends CANCELLED or SUCCEEDED; after the
warm-up round the daemon's fds return to their level and its RSS grows by less than
RSS_GROWTH_MIB over the remaining rounds."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

import offloadd
from faultlib import FULL, S, FaultDaemon, make_assets, make_workspace, spec, state_name

CLIENTS = 200 if FULL else 24
ROUNDS = 6 if FULL else 3
RSS_GROWTH_MIB = 32
FD_SLACK = 8
FINAL = (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED)


def one_client(target: str, ws, name: str) -> dict:
    with offloadd.Client(target, timeout=60) as c:
        job = c.create_job(spec(ws, name, steps=5000, save_steps=100000, nvme=False, accum=1))
        events = []
        cancelled = False
        for e in c.watch_job(job.id):
            events.append(e)
            if not cancelled:
                c.cancel_job(job.id)
                cancelled = True
            if e.HasField("state_change") and e.state_change.state in FINAL:
                break
        final = c.get_job(job.id)
        return {"job": job.id, "cursors": [e.cursor for e in events], "final": final.state,
                "last_event_state": events[-1].state_change.state if events and events[-1].HasField("state_change")
                else None}


@pytest.mark.timeout(600 if FULL else 180)
def test_many_clients_create_watch_cancel_without_loss_or_growth(binary_dir, tmp_path, figures):
    ws = make_workspace(tmp_path / "ws", make_assets(tmp_path / "assets"))
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws).start()
    figures.did.append(f"{CLIENTS} concurrent clients x {ROUNDS} rounds over the Unix socket: create a job, watch it, "
                       f"cancel it, read the watch to its end; daemon VmRSS and fds sampled per round")
    samples = [(d.rss_kib(), d.fds())]
    problems = []
    jobs = 0
    t0 = time.monotonic()
    try:
        with cf.ThreadPoolExecutor(CLIENTS) as pool:
            for r in range(ROUNDS):
                futs = [pool.submit(one_client, d.target, ws, f"r{r}c{i}") for i in range(CLIENTS)]
                for f in cf.as_completed(futs, timeout=120):
                    res = f.result()
                    jobs += 1
                    cur = res["cursors"]
                    if cur != list(range(1, len(cur) + 1)):
                        problems.append(f"{res['job']}: cursors not contiguous from 1: {cur[:20]}")
                    if res["final"] not in FINAL or res["last_event_state"] != res["final"]:
                        problems.append(f"{res['job']}: final {state_name(res['final'])}, watch ended on "
                                        f"{res['last_event_state']}")
                time.sleep(0.5)  # let finished streams' resources go
                samples.append((d.rss_kib(), d.fds()))
        took = time.monotonic() - t0
        assert d.alive(), d.log()[-3000:]
    finally:
        d.stop()
    rss = [s[0] // 1024 for s in samples]
    fds = [s[1] for s in samples]
    growth = rss[-1] - rss[1]
    figures.numbers.update(clients=CLIENTS, rounds=ROUNDS, jobs=jobs, seconds=round(took, 1), rss_mib=rss, fds=fds,
                           events_lost=len(problems))
    figures.happened.append(f"{jobs} jobs created, watched and cancelled in {took:.1f} s; VmRSS MiB per round {rss}; "
                            f"fds per round {fds}")
    figures.lost.append(f"{len(problems)} watches with missing/duplicate events or a wrong final state; RSS growth "
                        f"after warm-up {growth} MiB; fd growth {max(fds[1:]) - fds[1]}")
    assert not problems, figures.defect("events lost under load: " + "; ".join(problems[:5]))
    assert growth < RSS_GROWTH_MIB, figures.defect(f"daemon RSS grew {growth} MiB over {ROUNDS - 1} rounds: {rss}")
    assert max(fds[1:]) - fds[1] <= FD_SLACK, figures.defect(f"daemon fds grew: {fds}")
