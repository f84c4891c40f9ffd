"""The hostile CreateJob requests against a daemon binary (docs/faults.md):
the peak RSS growth of an 8 MB chat template, and the CPU the daemon spends on a 512-path request
with a ~3M-step template that its client abandons after 5 s (and, with a second argument, on the
same request waited for). CPU is the daemon's utime + stime, so it holds on a loaded machine.

    PYTHONPATH=client/python python bench/daemon/validation_dos.py build/daemon/offloadd [wait]
"""
import json, os, pathlib, shutil, sys, tempfile, time
SOURCE = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SOURCE / "tests/python/daemon")); sys.path.insert(0, str(SOURCE / "tests/python"))
import grpc
from daemon_process import DaemonProcess
import offloadd
from offloadd import _shared

binary = pathlib.Path(sys.argv[1])
ws = pathlib.Path(tempfile.mkdtemp(prefix="h2m-"))
shared = SOURCE.parent / "shared"
model = ws / "model"; model.mkdir()
(model / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}))
(model / "model.safetensors").write_bytes(b"x")
shutil.copy(shared / "data/tokenizers/gpt2/tokenizer.json", model / "tokenizer.json")
alpaca = json.loads((shared / "data/alpaca/alpaca_5000.json").read_text())[:20]
(ws / "alpaca.jsonl").write_text("".join(json.dumps(r) + "\n" for r in alpaca))

def hwm(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmHWM:"): return int(l.split()[1]) // 1024
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def request(template_src, paths):
    t = ws / "t.jinja"; t.write_text(template_src)
    spec = {"model": {"path": str(model)}, "dataset": {"paths": paths[:256], "eval_paths": paths[256:], "format": "alpaca",
            "max_seq_length": 128, "template": str(t)}, "training": {"per_device_train_batch_size": 2, "max_steps": 10},
            "output_dir": str(ws / "out"), "dropout": "disable"}
    proto, problem = _shared.read_spec(spec)
    return _shared.create_job_request(proto, True, "")

d = DaemonProcess(binary, ws, ).start()
try:
    c = offloadd.Client(d.target, timeout=600)
    c.create_job({"model": {"path": str(model)}, "dataset": {"paths": [str(ws / "alpaca.jsonl")], "format": "alpaca", "max_seq_length": 128},
                  "training": {"per_device_train_batch_size": 2}, "output_dir": str(ws / "out"), "dropout": "disable"}, validate_only=True)
    pid = d.proc.pid
    # (a) an 8 MB template
    h0, c0, t0 = hwm(pid), cpu(pid), time.monotonic()
    big = "{{ 'a' }}" * (8 * 1024 * 1024 // 9)
    try:
        c._jobs.CreateJob(request(big, [str(ws / "alpaca.jsonl")]), timeout=600)
        res = "OK"
    except grpc.RpcError as e:
        res = f"{e.code().name}: {e.details()[:150]}"
    print(f"8 MB template: {res}; took {time.monotonic()-t0:.1f} s, daemon CPU {cpu(pid)-c0:.1f} s, peak RSS +{hwm(pid)-h0} MiB")
    # (b) slow template x 512 paths, abandoned after 5 s; daemon CPU over the following 60 s
    slow = "{% for i in range(700) %}{% for j in range(1000) %}{% endfor %}{% endfor %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    req = request(slow, [str(ws / "alpaca.jsonl")] * 512)
    c0, t0 = cpu(pid), time.monotonic()
    try:
        c._jobs.CreateJob(req, timeout=5)
        res = "OK"
    except grpc.RpcError as e:
        res = e.code().name
    c1 = cpu(pid)
    time.sleep(60)
    print(f"512 paths, slow template, abandoned at 5 s ({res}): daemon CPU {c1-c0:.1f} s during the call, "
          f"{cpu(pid)-c1:.1f} s in the 60 s after it")
    if len(sys.argv) > 2:  # waited for
        c0, t0 = cpu(pid), time.monotonic()
        try:
            c._jobs.CreateJob(req, timeout=600); res = "OK"
        except grpc.RpcError as e:
            res = f"{e.code().name}: {e.details()[:200]}"
        print(f"512 paths waited for: {res}; took {time.monotonic()-t0:.1f} s, daemon CPU {cpu(pid)-c0:.1f} s")
finally:
    d.stop()
    shutil.rmtree(ws, ignore_errors=True)
