"""The measurements, each run between the two ends of a built datapath with real tools.

iperf3 (Debian's) for TCP throughput and its CPU accounting; sluice.net.rr for request/
response latency; torch.distributed gloo for all-reduce; the data-parallel example for step
time; sluice's HTTP file server and the cache's fsspec reader for remote dataset reads.
Every child process is started through the lab (so teardown ends it) and every wait is
bounded. A measurement that cannot run here returns {"skipped": why} instead of failing.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.net.datapaths import Endpoints
from sluice.net.ipcmd import in_netns, tool
from sluice.net.lab import Lab

IPERF_PORT, RR_PORT, DIST_PORT = 5201, 5301, 29500


def summary(values: Sequence[float]) -> dict[str, float | int]:
    """median, quartiles, min, max, mean and stdev of the repeats (spread 0 for one)."""
    v = [float(x) for x in values]
    if not v:
        return {"n": 0}
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0], v[0], v[0]]
    return {
        "p25": q[0],
        "p75": q[2],
        "median": statistics.median(v),
        "min": min(v),
        "max": max(v),
        "mean": statistics.fmean(v),
        "stdev": statistics.stdev(v) if len(v) > 1 else 0.0,
        "n": len(v),
    }


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment with this sluice importable (the children are `python -m sluice.net...`)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


_next = itertools.count()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port(ep: Endpoints, base: int) -> int:
    """A fresh port inside our own namespaces (never one a just-ended server may still hold);
    in the shared host namespace (loopback), a free one *below* the ephemeral range.

    A port taken from the ephemeral range (bind to 0, then release) is a race on loopback: while
    a rank imports torch, any process's outgoing connection may be given that port as its source
    (seen: rank 0's store failed with EADDRINUSE and rank 1 waited for it), and a client
    retrying 127.0.0.1:P can even be connected to itself. Below the range only an explicit bind
    can take the port."""
    if ep.server_ns is not None:
        return base + next(_next) % 90
    low = _ephemeral_low()
    span = max(1, low - base)
    for _ in range(min(span, 2000)):
        port = base + next(_next) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {base} and {low} on 127.0.0.1")


def _run_client(argv: list[str], ns: str | None, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(in_netns(ns, argv), capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}")
    return proc.stdout


def mtu_of(ep: Endpoints) -> int:
    """The MTU in effect on the client's interface (read back, not what we asked for)."""
    out = _run_client(["cat", f"/sys/class/net/{ep.iface}/mtu"], ep.client_ns, 10)
    return int(out.strip())


# ---------------------------------------------------------------------- iperf3
def iperf3(lab: Lab, ep: Endpoints, *, streams: int, duration_s: int, repeats: int) -> dict[str, Any]:
    """iperf3 reads -t as whole seconds (0.5 would become 0: run for ever), so duration_s is an int >= 1."""
    if duration_s < 1:
        raise ValueError(f"duration_s: iperf3 runs whole seconds, got {duration_s}")
    exe = tool("iperf3")
    if exe is None:
        return {"skipped": "iperf3 is not installed (apt-get install iperf3; scripts/setup.sh does it)"}
    gbps, cpu_per_gb, retrans, mss = [], [], [], None
    for _ in range(repeats):
        port = _port(ep, IPERF_PORT)
        server = lab.spawn(ep.server_ns, [exe, "-s", "-1", "-B", ep.server_ip, "-p", str(port)], stderr=subprocess.PIPE)
        try:
            argv = [exe, "-c", ep.server_ip, "-p", str(port), "-t", str(duration_s), "-P", str(streams), "-J"]
            deadline = time.monotonic() + 10
            while True:  # the server may not listen yet (iperf3 -J may exit 0 with an "error" field)
                proc = subprocess.run(
                    in_netns(ep.client_ns, argv), capture_output=True, text=True, timeout=duration_s + 30, check=False
                )
                try:
                    j = json.loads(proc.stdout) if proc.stdout.strip() else {}
                except ValueError:
                    j = {}
                refused = "unable to connect" in str(j.get("error", "")) + proc.stderr
                if not refused or time.monotonic() > deadline or server.poll() is not None:
                    break
                time.sleep(0.1)
            if "error" in j or "end" not in j:
                server_err = server.stderr.read().decode()[-400:] if server.poll() is not None and server.stderr else ""
                why = j.get("error") or proc.stderr.strip() or "no result"
                raise RuntimeError(f"iperf3: {why}{'; server: ' + server_err if server_err else ''}")
        finally:
            lab.reap(server)
        end = j["end"]
        recv = end["sum_received"]
        cpu = end["cpu_utilization_percent"]
        gbps.append(recv["bits_per_second"] / 1e9)
        gb = recv["bytes"] / 1e9
        cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100.0 * recv["seconds"]
        cpu_per_gb.append(cpu_s / gb if gb > 0 else float("nan"))
        retrans.append(end.get("sum_sent", {}).get("retransmits", 0))
        mss = j.get("start", {}).get("tcp_mss_default", mss)
    return {
        "streams": streams,
        "duration_s": duration_s,
        "gbps": summary(gbps),
        "cpu_s_per_gb": summary(cpu_per_gb),
        "retransmits": summary(retrans),
        "tcp_mss": mss,
    }


# ---------------------------------------------------------------------- latency
def latency(lab: Lab, ep: Endpoints, *, count: int, size: int, repeats: int) -> dict[str, Any]:
    import numpy as np

    p50, p99 = [], []
    for _ in range(repeats):
        port = _port(ep, RR_PORT)
        common = ["--host", ep.server_ip, "--port", str(port), "--size", str(size)]
        server = lab.spawn(ep.server_ns, [sys.executable, "-m", "sluice.net.rr", "serve", *common], env=child_env())
        try:
            out = _run_client(
                [sys.executable, "-m", "sluice.net.rr", "ping", *common, "--count", str(count)],
                ep.client_ns,
                timeout=90,
                env=child_env(),
            )
        finally:
            lab.reap(server)
        rtts = np.asarray(json.loads(out)["rtt_us"])
        if rtts.size == 0:
            raise RuntimeError("no round trips completed")
        p50.append(float(np.percentile(rtts, 50)))
        p99.append(float(np.percentile(rtts, 99)))
    return {"size": size, "count": count, "p50_us": summary(p50), "p99_us": summary(p99)}


# ---------------------------------------------------------------------- all-reduce
def allreduce(
    lab: Lab, ep: Endpoints, *, sizes: Sequence[int], rounds: int, budget_s: float, timeout_s: float = 600
) -> dict[str, Any]:
    """Two ranks, rank 0 at the server end; GLOO_SOCKET_IFNAME is the datapath's interface."""
    port = _port(ep, DIST_PORT)
    env = child_env({"GLOO_SOCKET_IFNAME": ep.iface, "OMP_NUM_THREADS": "1"})
    with tempfile.TemporaryDirectory(prefix="sluice-net-") as tmp:
        out = Path(tmp) / "allreduce.json"
        common = ["--world", "2", "--addr", ep.server_ip, "--port", str(port), "--sizes", ",".join(map(str, sizes))]
        common += ["--rounds", str(rounds), "--budget-s", str(budget_s)]
        logs = [open(Path(tmp) / f"rank{r}.log", "w") for r in (0, 1)]  # noqa: SIM115 - closed below
        try:
            r0 = lab.spawn(ep.server_ns, [sys.executable, "-m", "sluice.net.allreduce", "--rank", "0", *common,
                                          "--out", str(out)], env=env, stdout=logs[0], stderr=logs[0])  # fmt: skip
            r1 = lab.spawn(ep.client_ns, [sys.executable, "-m", "sluice.net.allreduce", "--rank", "1", *common],
                           env=env, stdout=logs[1], stderr=logs[1])  # fmt: skip
            codes = []
            for p in (r0, r1):
                try:
                    codes.append(p.wait(timeout_s))
                finally:
                    lab.reap(p)
        finally:
            for f in logs:
                f.close()
        if codes != [0, 0] or not out.exists():
            tail = (Path(tmp) / "rank0.log").read_text()[-800:] + (Path(tmp) / "rank1.log").read_text()[-800:]
            raise RuntimeError(f"all-reduce ranks exited {codes}: {tail}")
        data = json.loads(out.read_text())
    rows = []
    for r in data["results"]:
        t = summary(r["times_s"])
        med = float(t.get("median", float("nan")))
        rows.append(
            {
                "bytes": r["bytes"],
                "time_s": t,
                "algbw_gbps": r["bytes"] * 8 / med / 1e9 if med else None,
                "sample": r.get("sample", {}),
            }
        )
    return {"exact": data["exact"], "world": data["world"], "sizes": rows}


# ---------------------------------------------------------------------- data-parallel job
def ddp_example() -> Path | None:
    """examples/ddp.py of this checkout (sluice run from a source tree), if there is one."""
    cand = Path(__file__).resolve().parents[3] / "examples" / "ddp.py"
    return cand if cand.is_file() else None


def ddp_step(lab: Lab, ep: Endpoints, *, steps: int, repeats: int, timeout_s: float = 600) -> dict[str, Any]:
    script = ddp_example()
    if script is None:
        return {"skipped": "examples/ddp.py not found (run from a sluice source checkout)"}
    medians: list[float] = []
    teardown: list[dict[str, Any]] = []
    for _ in range(repeats):
        port = _port(ep, DIST_PORT + 1)  # a fresh one each repeat: the last one's may linger
        with tempfile.TemporaryDirectory(prefix="sluice-net-ddp-") as tmp:
            procs = []
            for rank, ns in ((0, ep.server_ns), (1, ep.client_ns)):
                env = child_env({
                    "GLOO_SOCKET_IFNAME": ep.iface, "MASTER_ADDR": ep.server_ip, "MASTER_PORT": str(port),
                    "RANK": str(rank), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
                    "SLUICE_RUN_DIR": f"{tmp}/run{rank}", "SLUICE_CHECKPOINT_DIR": f"{tmp}/ckpt",
                })  # fmt: skip
                argv = [sys.executable, str(script), "--steps", str(steps), "--stats", f"{tmp}/stats{rank}.json"]
                procs.append(lab.spawn(ns, argv, env=env, cwd=str(script.parent), stderr=subprocess.PIPE))
            codes = []
            for p in procs:
                try:
                    _, err = p.communicate(timeout=timeout_s)
                    codes.append((p.returncode, (err or b"").decode()[-600:]))
                finally:
                    lab.reap(p)
            done = all(Path(f"{tmp}/stats{r}.json").exists() for r in (0, 1))
            if any(c for c, _ in codes):
                if not done:
                    raise RuntimeError(f"ddp ranks failed: {codes}")
                # Every step ran and both ranks wrote their stats (after the last step, before the
                # group is torn down): the step times are good; the exit is kept, not hidden.
                teardown.append({"repeat": len(medians), "exits": [describe_exit(c) for c, _ in codes],
                                 "stderr": [e[-300:] for _, e in codes]})  # fmt: skip
            stats = json.loads(Path(f"{tmp}/stats0.json").read_text())
            medians.append(statistics.median(stats["step_s"]))
    out: dict[str, Any] = {"steps": steps, "replicas": 2, "step_s": summary(medians)}
    if teardown:
        out["teardown_failed"] = teardown
    return out


def describe_exit(code: int | None) -> str:
    """A process's exit in words: a negative return code is the signal that ended it."""
    if code is None or code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


# ---------------------------------------------------------------------- remote dataset reads
def dataload(lab: Lab, ep: Endpoints, *, root: Path, threads: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"threads": threads}
    for part in ("small", "large"):
        mbps, files_s, n_files, n_bytes = [], [], 0, 0
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="sluice-net-data-") as tmp:
                port_file = Path(tmp) / "port"
                server = lab.spawn(
                    ep.server_ns,
                    [sys.executable, "-m", "sluice.net.dataload", "serve", "--root", str(root / part),
                     "--host", ep.server_ip, "--port-file", str(port_file)],
                    env=child_env(),
                )  # fmt: skip
                try:
                    deadline = time.monotonic() + 30
                    while not port_file.exists() or not port_file.read_text():
                        if time.monotonic() > deadline or server.poll() is not None:
                            raise RuntimeError("the data server did not start")
                        time.sleep(0.05)
                    url = f"http://{ep.server_ip}:{port_file.read_text()}/"
                    res = json.loads(
                        _run_client(
                            [
                                sys.executable,
                                "-m",
                                "sluice.net.dataload",
                                "read",
                                "--url",
                                url,
                                "--threads",
                                str(threads),
                            ],
                            ep.client_ns,
                            timeout=300,
                            env=child_env(),
                        )
                    )
                finally:
                    lab.reap(server)
            n_files, n_bytes = res["files"], res["bytes"]
            mbps.append(res["bytes"] / res["seconds"] / 1e6)
            files_s.append(res["files"] / res["seconds"])
        out[part] = {"files": n_files, "bytes": n_bytes, "mb_per_s": summary(mbps), "files_per_s": summary(files_s)}
    return out
