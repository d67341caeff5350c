"""tracklake as an accelerate tracker.

``Accelerator(log_with=[TracklakeTracker(project="p")])`` works everywhere; importing this
module also makes ``log_with="tracklake"`` work in this process (import it in every
process, before building the `Accelerator`). See docs/integrations.md.
"""

from tracklake._integrations.accelerate import TracklakeTracker, register

register()

__all__ = ["TracklakeTracker", "register"]
