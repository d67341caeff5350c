"""What the first `tracklake.query` of a Python process costs, beside the second, and
whether it loaded pandas (pyarrow imports it on its first `pa.array`, `pa.scalar` or
`to_numpy`: apache/arrow#34994).

    python benchmarks/first_question.py STORE [--processes 7] [--before DIR]

Each question is asked in PROCESSES fresh processes: `import tracklake`, then the question
twice, each timed in the process. With `--before DIR` (a directory holding an earlier
`tracklake` package, such as a worktree's `store/` linked as `DIR/tracklake`), the
earlier code's processes are interleaved with this one's. Questions: one run's history
(the run named first in the store), the runs listing, the last value of a key per run.
Run with bytecode caching on (`PYTHONDONTWRITEBYTECODE` unset), as users' installs are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import tracklake
t1 = time.perf_counter()
first = tracklake.query(sys.argv[2], root=sys.argv[1])
t2 = time.perf_counter()
tracklake.query(sys.argv[2], root=sys.argv[1])
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first": t2 - t1, "second": t3 - t2,
                  "rows": first.num_rows, "pandas": "pandas" in sys.modules}))
"""


def _ask(store: str, question: str, path: str | None) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if path is not None:
        env["PYTHONPATH"] = path
    out = subprocess.run([sys.executable, "-c", _CHILD, store, question], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--before", help="a directory holding an earlier tracklake")
    args = parser.parse_args()
    import tracklake

    one = tracklake.query("SELECT project, run FROM runs ORDER BY project, run LIMIT 1",
                          root=args.store).to_pylist()[0]
    key = tracklake.query(
        f"SELECT min(key) AS k FROM metrics WHERE project = '{one['project']}' "
        f"AND run = '{one['run']}'", root=args.store).to_pylist()[0]["k"]
    questions = {
        "one run's history": f"SELECT step, value FROM metrics WHERE project = "
                             f"'{one['project']}' AND run = '{one['run']}' "
                             f"AND key = '{key}' ORDER BY step",
        "the runs listing": "SELECT project, run, status FROM runs",
        "last value per run": f"SELECT project, run, last(value ORDER BY step) FROM "
                              f"metrics WHERE key = '{key}' GROUP BY ALL",
    }
    codes = {"this": None} if args.before is None else {"before": args.before, "this": None}
    print("| question | code | first (median, range) | warm (median) | pandas |")
    print("|---|---|---:|---:|---|")
    for name, question in questions.items():
        seen: dict[str, list[dict[str, float]]] = {code: [] for code in codes}
        for _ in range(args.processes):
            for code, path in codes.items():
                seen[code].append(_ask(args.store, question, path))
        for code, runs in seen.items():
            first = [1000 * r["first"] for r in runs]
            second = [1000 * r["second"] for r in runs]
            loaded = {r["pandas"] for r in runs}
            print(f"| {name} | {code} | {statistics.median(first):.0f} ms "
                  f"({min(first):.0f}–{max(first):.0f}) | {statistics.median(second):.1f} ms"
                  f" | {'loaded' if True in loaded else 'not loaded'} |")


if __name__ == "__main__":
    main()
