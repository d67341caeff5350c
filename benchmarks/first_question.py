"""What the first `tracklake.query` of a Python process costs, beside the second, and
whether it loaded pandas (pyarrow imports it on its first `pa.array`, `pa.scalar` or
`to_numpy`: apache/arrow#34994).

    python benchmarks/first_question.py STORE [--processes 7] [--before DIR] [--asks 2]
    python benchmarks/first_question.py STORE --processes 3 --asks 10 --before DIR \
        --question "last value per run"     # how soon a process's questions are warm

Each question is asked in PROCESSES fresh processes: `import tracklake`, then the question
ASKS times one after the other (twice by default), each timed in the process; the table
gives the first's median and range and the median of each later one. With `--before
DIR` (a directory holding an earlier `tracklake` package, such as a worktree's `store/`
linked as `DIR/tracklake`), the earlier code's processes are interleaved with this one's.
Questions: one run's history (the run named first in the store), the runs listing, the
last value of a key per run.
Run with bytecode caching on (`PYTHONDONTWRITEBYTECODE` unset), as users' installs are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import tracklake
t1 = time.perf_counter()
times = []
for _ in range(int(sys.argv[3])):
    started = time.perf_counter()
    answer = tracklake.query(sys.argv[2], root=sys.argv[1])
    times.append(time.perf_counter() - started)
print(json.dumps({"import": t1 - t0, "times": times, "rows": answer.num_rows,
                  "pandas": "pandas" in sys.modules}))
"""


def _ask(store: str, question: str, path: str | None, asks: int) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if path is not None:
        env["PYTHONPATH"] = path
    out = subprocess.run([sys.executable, "-c", _CHILD, store, question, str(asks)],
                         env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--before", help="a directory holding an earlier tracklake")
    parser.add_argument("--asks", type=int, default=2,
                        help="questions asked one after the other in each process")
    parser.add_argument("--question", action="append",
                        help="only this question (of those above; may be repeated)")
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
    if args.question:
        questions = {name: questions[name] for name in args.question}
    codes = {"this": None} if args.before is None else {"before": args.before, "this": None}
    later = "warm (median)" if args.asks == 2 else \
        f"2nd to {args.asks}th (median of each, ms)"
    print(f"| question | code | first (median, range) | {later} | pandas |")
    print("|---|---|---:|---:|---|")
    for name, question in questions.items():
        seen: dict[str, list[dict[str, Any]]] = {code: [] for code in codes}
        for _ in range(args.processes):
            for code, path in codes.items():
                seen[code].append(_ask(args.store, question, path, args.asks))
        for code, runs in seen.items():
            first = [1000 * r["times"][0] for r in runs]
            each = [statistics.median(1000 * r["times"][i] for r in runs)
                    for i in range(1, args.asks)]
            shown = f"{each[0]:.1f} ms" if len(each) == 1 else \
                " / ".join(f"{t:.0f}" for t in each)
            loaded = {r["pandas"] for r in runs}
            print(f"| {name} | {code} | {statistics.median(first):.0f} ms "
                  f"({min(first):.0f}–{max(first):.0f}) | {shown}"
                  f" | {'loaded' if True in loaded else 'not loaded'} |")


if __name__ == "__main__":
    main()
