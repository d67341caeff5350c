#!/usr/bin/env python
"""What parsing JSON allocates against what `bounded_json.parse_cost` says it may.

Each JSON file read from a store is parsed only if `parse_cost` of its text is within a
budget (store/_format/bounded_json.py). This parses ``--mib`` MiB of each of a list of
shapes (small values that cost a Python object each, nested lists, escaped strings), in
a process of its own each, and prints what the parse added to the process's peak RSS
beside the cost: the cost must never be below it.

Usage (from the repository root)::

    python benchmarks/json_parse_cost.py --mib 32
"""

from __future__ import annotations

import argparse
import subprocess
import sys

SHAPES = ['[],', '{},', '0.5,', '"ab",', '[0],', '{"a":0},', '{"a":{}},', '{"ab":"cd"},',
          '{"a":0,"b":1},', '"\\u00e9\\u00e9",', '"\\ud83d\\ude00",', '[[[]]],',
          '{"a":[0.5]},', 'true,', '12345678901,', '"abcdefghij",', '{"a":"b"},']

_ONE = """
import json, resource, sys
from tracklake._format.bounded_json import parse_cost
shape, mib = sys.argv[1], int(sys.argv[2])
n = (mib << 20) // len(shape)
text = ("[" + shape * (n - 1) + shape.rstrip(",") + "]").encode()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
parsed = json.loads(text)
added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) << 10
print(added, parse_cost(text))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=32)
    args = parser.parse_args()
    print(f"{'shape':24} {'parse added, MiB':>17} {'parse_cost, MiB':>16}  covered")
    for shape in SHAPES:
        out = subprocess.run([sys.executable, "-c", _ONE, shape, str(args.mib)],
                             capture_output=True, text=True, check=True).stdout.split()
        added, cost = int(out[0]), int(out[1])
        print(f"{shape:24} {added >> 20:>17,} {cost >> 20:>16,}  {cost >= added}")


if __name__ == "__main__":
    main()
