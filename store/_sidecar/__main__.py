"""`python -m tracklake._sidecar export DEST ...`: how a sidecar exporter is run.

The same command line as `tracklake export`, at a lower CPU priority (NICENESS): on a
machine where the exporters compete with training for cores, training comes first and
the exporters catch up when it leaves a core idle, or after it ends. This module runs in
the exporter's process, never in the trainer's.
"""

import os
import sys

from tracklake._sidecar.plan import NICENESS

try:
    os.nice(NICENESS)
except OSError as exc:  # a system that refuses it: run at the trainer's priority
    print(f"tracklake export: could not lower the priority ({exc})", file=sys.stderr)

from tracklake._cli.main import main  # after the priority is set

sys.argv[0] = "tracklake"
main()
