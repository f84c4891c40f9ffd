"""Log lines carry <N> syslog priorities when stderr goes to the journal
(JOURNAL_STREAM=<dev>:<inode> names stderr), so `journalctl -p warning` finds the warnings; and
no prefix otherwise."""

import os
import subprocess


def test_priorities_when_stderr_is_the_journal(binary_dir, tmp_path):
    state = tmp_path / "state"
    cfg = tmp_path / "ok.yaml"
    # A TCP listener without its files fails at startup, after the logger has printed info lines.
    cfg.write_text(f"state_dir: {state}\nallowed_roots: [{tmp_path}]\nserver:\n  unix_socket: {tmp_path}/s.sock\n"
                   f"  tcp: {{listen: 127.0.0.1:0, tls_cert_file: {tmp_path}/no.pem, tls_key_file: {tmp_path}/no.key,"
                   f" auth_token_file: {tmp_path}/no.token}}\nmetrics: {{listen: ''}}\n")
    for journal in (True, False):
        log = tmp_path / f"out-{journal}.log"
        with open(log, "wb") as f:
            env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
            if journal:
                st = os.fstat(f.fileno())
                env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
            r = subprocess.run([str(binary_dir / "daemon" / "offloadd"), "--config", str(cfg)], stdout=f, stderr=f,
                               env=env, timeout=60)
        assert r.returncode != 0
        lines = [l for l in log.read_text().splitlines() if l]
        infos = [l for l in lines if " I offloadd] " in l]
        errors = [l for l in lines if " E offloadd] " in l]
        assert infos and errors, lines
        if journal:
            assert all(l.startswith("<6>") for l in infos), infos
            assert all(l.startswith("<3>") for l in errors), errors
        else:
            assert not any(l.startswith("<") for l in lines), lines
