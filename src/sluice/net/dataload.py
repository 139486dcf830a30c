"""Remote dataset reads across a datapath: the dataset cache's cold path.

`serve` runs sluice's own HTTP file server (sluice.data.httpserve, no injected latency) on
the server pod's address; `read` lists it and fetches every file through
`sluice.data.source.Source` — the fsspec HTTP reader the node cache fills itself from on a
miss — with a thread pool, and prints bytes, files and seconds as JSON. `make` writes the
dataset (small image-like files and a few large ones) once per bench run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def make(root: Path, small: int, small_kb: int, large: int, large_mb: int) -> None:
    """Incompressible files (os.urandom), so no layer can cheat by compressing them."""
    for sub, n, size in (("small", small, small_kb * 1024), ("large", large, large_mb * 1024 * 1024)):
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            f = d / f"{i:05d}.bin"
            if not f.exists() or f.stat().st_size != size:
                f.write_bytes(os.urandom(size))


def serve(root: str, host: str, port_file: str, limit_s: float) -> int:
    from sluice.data.httpserve import DataServer

    with DataServer(root, host=host) as srv:
        Path(port_file).write_text(str(srv.port))
        time.sleep(limit_s)  # the lab ends this process when the readers are done
    return 0


def read(url: str, threads: int) -> int:
    from sluice.data.source import Source

    src = Source(url)
    manifest = src.list()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(lambda kv: len(src.fetch(kv[0], kv[1])), zip(manifest.keys, manifest.sizes, strict=True)))
    dt = time.perf_counter() - t0
    json.dump({"files": len(sizes), "bytes": sum(sizes), "seconds": dt}, sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sluice.net.dataload")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--root", required=True)
    s.add_argument("--host", required=True)
    s.add_argument("--port-file", required=True)
    s.add_argument("--limit-s", type=float, default=600.0)
    r = sub.add_parser("read")
    r.add_argument("--url", required=True)
    r.add_argument("--threads", type=int, default=8)
    a = p.parse_args(argv)
    if a.mode == "serve":
        return serve(a.root, a.host, a.port_file, a.limit_s)
    return read(a.url, a.threads)


if __name__ == "__main__":
    sys.exit(main())
