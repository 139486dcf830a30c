"""The attacker: tenant A's job, trying every read, write, signal and request a hostile tenant
would try against the plane and tenant B. It prints one line, `ATTACK-REPORT {json}`:
for each attempt, whether it worked ("ok") and what it got. Stdlib only.

The targets come in its environment (the test knows the real paths; a real attacker would
guess them, which is only easier for it here)."""

import json
import os
import signal
import urllib.error
import urllib.request

T = json.loads(os.environ["TARGETS"])
SECRET = os.environ.get("HUNT", "")
report = {}


def attempt(name, fn):
    try:
        got = fn()
        report[name] = {"ok": True, "got": repr(got)[:160]}
    except Exception as err:  # every failure is an outcome, never a crash
        report[name] = {"ok": False, "got": f"{type(err).__name__}: {err}"[:160]}


def read(path):
    with open(path, "rb") as f:
        return f.read(200)


def write(folder):
    path = os.path.join(folder, f"pwned-{os.getpid()}")
    with open(path, "w") as f:
        f.write("pwned")
    os.unlink(path)
    return path


def hunt_environ():
    """Scan every process's environment for B's secret (what a real attacker would do)."""
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                if SECRET.encode() in read_all(f"/proc/{pid}/environ"):
                    seen.append(int(pid))
            except OSError:
                pass
    if not seen:
        raise PermissionError("no readable environment holds the secret")
    return seen


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def api(method, path, token=None):
    req = urllib.request.Request(T["url"] + path, method=method, data=b"{}" if method == "POST" else None)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(200)
    except urllib.error.HTTPError as err:
        raise PermissionError(f"HTTP {err.code}") from None


home, brun = T["home"], T["victim_run"]
for name in ("admin.token", "token", "sluice.db", "sluice.db-wal", "sluice.db-shm", "server.json", "server.log"):
    attempt(f"read home/{name}", lambda n=name: read(os.path.join(home, n)))
attempt("list home", lambda: os.listdir(home))
attempt("list home/runs", lambda: os.listdir(os.path.join(home, "runs")))
attempt("read B's log", lambda: read(os.path.join(brun, "job.log")))
attempt("read B's progress", lambda: read(os.path.join(brun, "attempt-1", "progress.jsonl")))
attempt("read B's attempt state", lambda: read(os.path.join(brun, "attempt-1", "state.json")))
attempt("read B's checkpoint", lambda: read(T["victim_checkpoint"]))
attempt("list B's run folder", lambda: os.listdir(brun))
attempt("list B's attempt folder", lambda: os.listdir(os.path.join(brun, "attempt-1")))
attempt("list B's checkpoints", lambda: os.listdir(os.path.join(brun, "checkpoints")))
attempt("list B's work folder", lambda: os.listdir(os.path.join(brun, "work")))
attempt("read B's /proc/pid/environ", lambda: read(f"/proc/{T['victim_pid']}/environ"))
attempt("read the plane's /proc/pid/environ", lambda: read(f"/proc/{T['plane_pid']}/environ"))
attempt("find B's secret in any /proc/*/environ", hunt_environ)
attempt("signal B's job", lambda: os.kill(T["victim_pid"], signal.SIGSTOP))
attempt("become root", lambda: os.setuid(0))
attempt("write into home", lambda: write(home))
attempt("write into home/runs", lambda: write(os.path.join(home, "runs")))
attempt("write into B's run folder", lambda: write(brun))
attempt("write into B's checkpoints", lambda: write(os.path.join(brun, "checkpoints")))
attempt("write into my own attempt folder", lambda: write(os.environ["SLUICE_RUN_DIR"]))
attempt("API: B's job without a token", lambda: api("GET", f"/v1/jobs/{T['victim_job']}"))
attempt("API: B's job with my token", lambda: api("GET", f"/v1/jobs/{T['victim_job']}", T["my_token"]))
attempt("API: B's log with my token", lambda: api("GET", f"/v1/jobs/{T['victim_job']}/logs", T["my_token"]))
attempt("API: cancel B's job", lambda: api("POST", f"/v1/jobs/{T['victim_job']}/cancel", T["my_token"]))
attempt("API: list tenants", lambda: api("GET", "/v1/tenants", T["my_token"]))
# Controls: what this job may do. They must work, or the failures above prove nothing.
attempt("control: write my home (its work folder)", lambda: write(os.environ["HOME"]))
attempt("control: write my checkpoints", lambda: write(os.environ["SLUICE_CHECKPOINT_DIR"]))
attempt("control: read my progress", lambda: read(os.path.join(os.environ["SLUICE_RUN_DIR"], "progress.jsonl")))
attempt("control: API: my own jobs", lambda: api("GET", "/v1/jobs", T["my_token"]))
print("ATTACK-REPORT " + json.dumps(report), flush=True)
