"""What sluice does on a machine with an NVIDIA GPU, end to end (not a product command).

    PYTHONPATH=src python scripts/gpu_check.py [--steps 3000]

Starts a throwaway plane (`sluice up`, policy `sluice` or --policy, a temporary SLUICE_HOME) and checks,
each as a PASS/FAIL line, exiting 1 on any failure:
- the plane finds the machine's GPUs with no CUDA_VISIBLE_DEVICES set, and the nodes offer them;
- two `gpus: 1` example jobs (mlp, cnn) each train on `cuda:0` and succeed, and never hold
  the same GPU at once where the machine has only one;
- the DDP example with one replica and one GPU talks NCCL and succeeds; on a machine of two
  GPUs or more, also a gang of two replicas, a GPU each (NCCL across two GPU fences and two
  Landlock domains);
- a job without `gpus` sees no GPU (`CUDA_VISIBLE_DEVICES` empty, torch finds none);
- a job asking for more GPUs than any node has is refused or left queued, saying why;
- the node's GPU utilisation reaches `/metrics` (`sluice_node_kpi{kpi="gpu0_util_pct"}`).
Tenant isolation follows the environment (SLUICE_ISOLATION); the examples' folder must be
readable by the tenant uids when it is on.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
failures: list[str] = []


def check(ok: bool, what: str, detail: object = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {what}" + (f"  [{detail}]" if detail != "" else ""), flush=True)
    if not ok:
        failures.append(what)
    return ok


def sluice(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from sluice.cli.main import app; sys.argv[0] = 'sluice'; app()"
    env = {**os.environ, "SLUICE_HOME": str(home)}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


def job(name: str, command: list[str], gpus: int, **resources: Any) -> dict[str, Any]:
    return {
        "name": name,
        "command": command,
        "workdir": str(EXAMPLES),
        "resources": {"cpu": {"min": 1, "max": 2}, "gpus": gpus, **resources},
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--policy", default="sluice", help="the plane's policy (sluice up --policy)")
    a = p.parse_args()
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    from sluice.agent.gpus import discover_gpus

    found = discover_gpus()
    check(bool(found.ids), "the machine's GPUs are found without CUDA_VISIBLE_DEVICES", found)
    check(discover_gpus({"CUDA_VISIBLE_DEVICES": ""}).ids == [], "CUDA_VISIBLE_DEVICES= (empty) hands out none")
    home = Path(tempfile.mkdtemp(prefix="sluice-gpu-check-"))
    up = sluice("up", "--detach", "--policy", a.policy, "--port", "0", home=home)
    if not check(up.returncode == 0, "sluice up", (up.stdout + up.stderr).strip()[-600:]):
        return 1
    check("GPU fence: each job is fenced" in up.stdout, "sluice up says the jobs are fenced from other GPUs", up.stdout)
    try:
        return run_checks(home, len(found.ids), a.steps)
    finally:
        down = sluice("down", home=home)
        print(down.stdout.strip(), down.stderr.strip()[-300:], flush=True)


def run_checks(home: Path, n_gpus: int, steps: int) -> int:
    from sluice.client import BadRequestError, Client, SluiceError

    os.environ["SLUICE_HOME"] = str(home)
    with Client() as c, Client(admin=True) as admin:
        nodes = c.nodes()
        offered = sum(n.gpus for n in nodes)
        check(offered == n_gpus, "the nodes offer every GPU found", [(n.name, n.gpus) for n in nodes])
        py = "python"
        t0 = time.time()
        mlp = c.submit(job("mlp-gpu", [py, "mlp.py", "--steps", str(steps)], 1)).id
        cnn = c.submit(job("cnn-gpu", [py, "cnn.py", "--steps", str(steps)], 1)).id
        ddp = c.submit(job("ddp-gpu", [py, "ddp.py", "--steps", "300", "--width", "256"], 1)).id
        probe = (
            "import os, torch; "
            "print('visible', repr(os.environ.get('CUDA_VISIBLE_DEVICES')), 'cuda', torch.cuda.is_available())"
        )
        cpu = c.submit(job("no-gpu", [py, "-c", probe], 0)).id
        # A job without GPUs that names one itself: the fence (agent/gpu_fence.py) refuses
        # it the device in the kernel, whatever CUDA_VISIBLE_DEVICES says.
        attack = (
            "import errno, os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
            "try:\n    os.close(os.open('/dev/nvidia0', os.O_RDWR)); got = 'open'\n"
            "except OSError as e:\n    got = errno.errorcode[e.errno]\n"
            "import torch\nprint('fenced', got, 'cuda', torch.cuda.is_available(), flush=True)\n"
        )
        fenced = c.submit(job("no-gpu-attack", [py, "-c", attack], 0)).id
        gang = None
        if n_gpus >= 2:  # two replicas of one gang, a GPU each, NCCL between them, each in its own
            # GPU fence and Landlock domain (the Unix-socket fence): NCCL's P2P transport passes
            # handles over an abstract socket, so it should fall back to shared memory or sockets.
            spec = job("ddp-gang", [py, "ddp.py", "--steps", "300", "--width", "256"], 1)
            spec["resources"]["replicas"] = {"min": 2, "max": 2}
            gang = c.submit(spec).id
        try:
            big = c.submit(job("too-many-gpus", [py, "-c", "pass"], n_gpus + 1))
            time.sleep(5)
            big = c.job(big.id)
            check(big.phase in ("Queued", "Pending", "Failed"), "a job wanting more GPUs than a node has is held back",
                  f"{big.phase}: {big.reason}")  # fmt: skip
            c.cancel(big.id)
        except (BadRequestError, SluiceError) as err:
            check(True, "a job wanting more GPUs than a node has is refused at submit", err)
        peak: dict[str, float] = {}
        deadline = time.time() + 420
        ids = {"mlp": mlp, "cnn": cnn, "ddp": ddp, "no-gpu": cpu, "no-gpu-attack": fenced}
        if gang is not None:
            ids["ddp-gang"] = gang
        while time.time() < deadline:
            states = {k: c.job(v) for k, v in ids.items()}
            for line in str(admin.request("GET", "/metrics")).splitlines():
                if line.startswith("sluice_node_kpi{") and "gpu" in line:
                    key, value = line.rsplit(" ", 1)
                    peak[key] = max(peak.get(key, 0.0), float(value))
            if all(s.phase in ("Succeeded", "Failed", "Cancelled") for s in states.values()):
                break
            time.sleep(2)
        print(f"all ended or gave up after {time.time() - t0:.0f} s", flush=True)
        for k, v in ids.items():
            rec = c.job(v)
            log = c.logs(v)
            print(f"--- {k} {v}: {rec.phase} {rec.reason}\n{log[-1500:]}", flush=True)
            check(rec.phase == "Succeeded", f"{k} succeeded", rec.reason)
            if k in ("mlp", "cnn"):
                check("training on cuda:0 (" in log, f"{k} trained on the GPU")
            if k == "ddp":
                check("on cuda:0 (nccl)" in log, "ddp used NCCL on the GPU")
            if k == "ddp-gang":
                check("world 2 on cuda:0 (nccl)" in log, "a two-replica gang ran NCCL across its fences")
            if k == "no-gpu":
                check("visible '' cuda False" in log, "a job without gpus sees none")
            if k == "no-gpu-attack":
                check("fenced EPERM cuda False" in log, "a job without gpus cannot open a GPU by naming it")
        if n_gpus == 1:
            spans = []
            for v in (mlp, cnn, ddp):
                rec = c.job(v)
                if rec.started_at is not None and rec.finished_at is not None and rec.restarts == 0:
                    spans.append((rec.started_at, rec.finished_at))
            spans.sort()
            overlap = any(b[0] < a[1] for a, b in itertools.pairwise(spans))
            check(len(spans) == 3 and not overlap, "one GPU: the three GPU jobs ran one at a time", spans)
        print("GPU KPIs seen in /metrics (peak):", peak, flush=True)
        check(any("gpu0_util_pct" in k and v > 0 for k, v in peak.items()), "GPU utilisation reaches /metrics")
    print(f"\n{len(failures)} failure(s): {failures}" if failures else "\nall checks passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
