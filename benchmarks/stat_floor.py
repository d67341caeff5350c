#!/usr/bin/env python
"""What validating the run catalog costs at least: the system calls themselves.

A warm question over every run of a store stats each path the catalog watches (a run's
directories, its parts and attempt files: 7 a run of one rank and one attempt) to see
that nothing changed since the catalog was written. This measures, over the paths of the
store's own catalog, each the median of ``--repeat``:

- ``mtimes_of``: what a question pays (`tracklake._read.mtimes`: two threads, pyarrow's
  ``get_file_info`` in C++ each);
- ``os.stat loop``: one Python thread calling ``os.stat``;
- ``stat(2) in C, one thread`` and ``two threads``: a C program compiled here with the
  system's ``cc`` (skipped without one), the floor for any reader in any language.

Usage (from the repository root; a store built by ``benchmarks/read_cost.py``)::

    python benchmarks/stat_floor.py --root /tmp/tracklake-read-cost/runs-10000-steps-200/store
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
static char **paths; static long count;
/* arg 0: every path; 1: the first half; 2: the second half */
static void *stat_range(void *arg) {
  long which = (long)arg, from = which == 2 ? count / 2 : 0;
  long to = which == 1 ? count / 2 : count;
  struct stat st;
  for (long i = from; i < to; i++) stat(paths[i], &st);
  return NULL;
}
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "r"); char line[8192]; long cap = 1 << 16;
  paths = malloc(sizeof(char *) * cap);
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (count == cap) paths = realloc(paths, sizeof(char *) * (cap *= 2));
    paths[count++] = strdup(line);
  }
  double t = now(); stat_range((void *)0L); double one = now() - t;
  pthread_t a, b; t = now();
  pthread_create(&a, NULL, stat_range, (void *)1L);
  pthread_create(&b, NULL, stat_range, (void *)2L);
  pthread_join(a, NULL); pthread_join(b, NULL);
  printf("%f %f\n", one, now() - t);
  return 0;
}
"""


def _median_ms(call: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    from tracklake._read.catalog import RunCatalog, _watched_of
    from tracklake._read.mtimes import _looped, mtimes_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    catalog = RunCatalog(args.root)
    paths = _watched_of(args.root, catalog._table).paths
    print(f"{catalog._table.num_rows} catalogued runs, {len(paths)} watched paths; "
          f"median of {args.repeat}, ms")
    asked = _median_ms(lambda: mtimes_of(paths), args.repeat)
    print(f"  mtimes_of (a question's)     {asked:8.1f}")
    print(f"  os.stat loop, one thread     {_median_ms(lambda: _looped(paths), args.repeat):8.1f}")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("  stat(2) in C: no C compiler here, skipped")
        return
    with tempfile.TemporaryDirectory() as folder:
        source, program, listed = (Path(folder) / n for n in ("stat.c", "stat", "paths"))
        source.write_text(_C)
        listed.write_text("\n".join(paths) + "\n")
        subprocess.run([compiler, "-O2", "-pthread", str(source), "-o", str(program)],
                       check=True)
        runs = [subprocess.run([str(program), str(listed)], check=True, capture_output=True,
                               text=True, env=dict(os.environ)).stdout.split()
                for _ in range(args.repeat)]
    for column, label in ((0, "one thread"), (1, "two threads")):
        seconds = statistics.median(float(r[column]) for r in runs)
        print(f"  stat(2) in C, {label:<14}{seconds * 1e3:8.1f}")


if __name__ == "__main__":
    main()
