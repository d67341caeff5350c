#!/usr/bin/env python
"""What opening a part costs: `open_part`, which every reader of a part goes through.

Opening checks the footer's checksum and format version, what the footer says the pages
decompress to, and what each page's own header says (the footer's column chunks read
from its Thrift bytes, every page header in them walked): a part planted with a footer
that understates its sizes is refused before pyarrow decompresses a page. This times it
for the first metric part and the first bundle of a store, the minimum and median of
``--repeat`` rounds of ``--opens`` opens each (a bundle: a tenth as many).

To compare with the code of another commit, run it with that tree on ``PYTHONPATH``
(``git worktree add /tmp/before REV; ln -s /tmp/before/store /tmp/pkg/tracklake``).

Usage (from the repository root; a store built by ``benchmarks/read_cost.py``)::

    python benchmarks/open_part.py --root /tmp/tracklake-read-cost/runs-1000-steps-200/store
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tracklake._format.part import open_part


def _per_open_us(path: Path, opens: int, repeat: int) -> list[float]:
    rounds = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(opens):
            open_part(path)
        rounds.append((time.perf_counter() - started) / opens * 1e6)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--opens", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    part = min(args.root.glob("metrics/**/part-*.parquet"))
    bundles = sorted(args.root.glob(".cache/bundles/bundle-*.parquet"))
    for name, path, opens in (("part", part, args.opens),
                              *((("bundle", bundles[0], max(args.opens // 100, 1)),)
                                if bundles else ())):
        rounds = _per_open_us(path, opens, args.repeat)
        print(f"{name:6} {path.stat().st_size:>11,} bytes  min {min(rounds):9.1f} us  "
              f"median {statistics.median(rounds):9.1f} us")


if __name__ == "__main__":
    main()
