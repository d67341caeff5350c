#!/usr/bin/env python
"""A store on a network file system against one on local disk, on the test bed of
`tests/_nodes.py` (an SFTP export mounted with sshfs, attribute and directory caches of
``--cache`` seconds, on loopback; docs/many-nodes.md).

Measured, each in a fresh process on a node of its own:

1. ``log()`` latency: ``--steps`` steps of 32 float metrics, each step after ``--work-ms``
   of busy work standing for a training step; per-call median and p99 of ``log()``, and
   the loop's slowdown against the same loop without a tracker, for the root on local
   disk and on the mount.
2. Reader latency: a writer on node A logs a step every 100 ms and flushes; a reader on
   node C asks ``max(step)`` of the run every 50 ms through its own mount; for each step
   the reader sees, the time from the writer's flush to the reader's first answer that
   holds it (the nodes share this machine's clock); median and p95. On local disk the
   same with both processes on the same directory.

Both also in ship mode (docs/many-nodes.md): the root on the mount, and
``TRACKLAKE_LOCAL_ROOT`` a folder on this machine's local disk standing for the node's
own disk, so that the ranks write locally and a thread ships the records to the mount.

Needs root, ``sshfs`` and ``sshd`` (Debian's ``sshfs openssh-server``). Usage::

    python benchmarks/shared_fs.py [--steps 3000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _nodes import FileServer, Node, missing

LOOP = """
import json, time, tracklake
keys = [f"actor/k{{i}}" for i in range(32)]
def work(ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
def loop(run):
    calls = []
    start = time.perf_counter()
    for step in range({steps}):
        work({work_ms})
        if run is not None:
            t = time.perf_counter_ns()
            run.log({{k: step + i / 32 for i, k in enumerate(keys)}}, step=step)
            calls.append(time.perf_counter_ns() - t)
    return time.perf_counter() - start, calls
bare, _ = loop(None)
run = tracklake.init(project="bench", run_id="loop", capture_identity=False,
                     system_metrics=False)
tracked, calls = loop(run)
t = time.perf_counter()
run.finish()
print(json.dumps({{"bare": bare, "tracked": tracked, "finish": time.perf_counter() - t,
                  "calls": calls}}))
"""

WRITER = """
import json, time, tracklake
with tracklake.init(project="bench", run_id="{run}", capture_identity=False,
                    system_metrics=False) as run:
    flushed = []
    for step in range({steps}):
        run.log({{"x": float(step)}}, step=step)
        run.flush()
        flushed.append(time.time())
        time.sleep(0.1)
print(json.dumps(flushed))
"""

READER = """
import json, time, tracklake
seen = {{}}
deadline = time.time() + {seconds}
while time.time() < deadline and len(seen) < {steps}:
    try:
        top = tracklake.query("SELECT max(step) AS s FROM metrics WHERE run = '{run}'"
                              ).column("s")[0].as_py()
    except Exception:
        top = None
    now = time.time()
    if top is not None:
        for step in range(top + 1):
            seen.setdefault(step, now)
    time.sleep(0.05)
print(json.dumps(seen))
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def log_latency(node: Node, steps: int, work_ms: float,
                env: dict[str, str] | None = None) -> dict[str, float]:
    out = json.loads(node.run(LOOP.format(steps=steps, work_ms=work_ms), timeout=1800,
                              env_extra=env))
    calls_us = [c / 1000 for c in out["calls"]]
    return {"median_us": statistics.median(calls_us), "p99_us": _percentile(calls_us, 0.99),
            "slowdown": out["tracked"] / out["bare"], "finish_s": out["finish"]}


def reader_latency(writer: Node, reader: Node, steps: int, run: str,
                   env: dict[str, str] | None = None) -> dict[str, float]:
    w = writer.popen(WRITER.format(steps=steps, run=run), env_extra=env)
    r = reader.popen(READER.format(steps=steps, run=run, seconds=steps * 0.1 + 60))
    flushed = json.loads(w.communicate(timeout=600)[0])
    seen = {int(k): v for k, v in json.loads(r.communicate(timeout=600)[0]).items()}
    lags = [seen[s] - flushed[s] for s in range(steps) if s in seen]
    return {"median_s": statistics.median(lags), "p95_s": _percentile(lags, 0.95),
            "seen": len(lags) / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--reader-steps", type=int, default=100)
    parser.add_argument("--cache", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    why = missing()
    if why is not None:
        sys.exit(f"shared_fs: the test bed cannot run here: {why}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = FileServer(Path(tmp) / "bed")
        try:
            local = server.home / "local"
            local.mkdir()
            (local / "store").mkdir()
            a = Node("node-a", server.mount("a", cache_seconds=args.cache))
            c = Node("node-c", server.mount("c", cache_seconds=args.cache))
            results["log: local disk"] = log_latency(_local(a, local), args.steps,
                                                     args.work_ms)
            results["log: network mount"] = log_latency(a, args.steps, args.work_ms)
            ship = {"TRACKLAKE_LOCAL_ROOT": str(server.home / "node-a-disk")}
            results["log: ship mode"] = log_latency(a, args.steps, args.work_ms, ship)
            results["reader: local disk"] = reader_latency(
                _local(a, local), _local(c, local), args.reader_steps, "local")
            results["reader: network mount, another node"] = reader_latency(
                a, c, args.reader_steps, "mount")
            results["reader: ship mode, another node"] = reader_latency(
                a, c, args.reader_steps, "shipped", ship)
        finally:
            server.close()
    base = results["log: local disk"]
    net = results["log: network mount"]
    print(f"{'':38} {'median':>10} {'p99/p95':>10} {'slowdown':>9}")
    for name, r in results.items():
        if name.startswith("log"):
            print(f"{name:38} {r['median_us']:8.1f}us {r['p99_us']:8.1f}us "
                  f"{r['slowdown']:8.3f}x")
        else:
            print(f"{name:38} {r['median_s']:9.2f}s {r['p95_s']:9.2f}s "
                  f"(saw {r['seen']:.0%} of the steps)")
    for name, r in (("network mount", net), ("ship mode", results["log: ship mode"])):
        print(f"{name} / local disk: log() median {r['median_us'] / base['median_us']:.2f}x"
              f", p99 {r['p99_us'] / base['p99_us']:.2f}x, loop slowdown "
              f"{r['slowdown'] / base['slowdown']:.3f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _local(node: Node, local: Path) -> Node:
    """`node` with its store on this machine's local disk instead of its mount."""
    return _LocalNode(node.name, node.mount, node.clock, node.boot_id, local / "store")


class _LocalNode(Node):
    def __init__(self, name: str, mount: object, clock: float, boot_id: str,
                 root: Path) -> None:
        super().__init__(name, mount, clock, boot_id)  # type: ignore[arg-type]
        self._root = root

    @property
    def root(self) -> Path:
        return self._root


if __name__ == "__main__":
    main()
