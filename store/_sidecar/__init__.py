"""Sidecar exporters: `init(..., export=[...])` starts, from global rank 0, one
``tracklake export DEST --run ID --follow`` process per destination and watches them from
a thread of its own.

plan.py turns ``export=`` into command lines (destination options from the caller and the
environment); supervisor.py starts them in sessions of their own, restarts one that dies
(with backoff, a bounded number of times) and prints what runs where. The exporters end on
their own: when the run reaches a final status, or when the training process is gone
(``--while-pid``), after delivering what the store holds.

The write path imports this package only when ``export=`` is given, and this package
imports nothing of the read side, the CLI or the exporters (tests/test_import_boundary.py).
"""

from tracklake._sidecar.plan import SidecarSpec, plan_sidecars
from tracklake._sidecar.supervisor import Sidecars, start_sidecars

__all__ = ["SidecarSpec", "Sidecars", "plan_sidecars", "start_sidecars"]
