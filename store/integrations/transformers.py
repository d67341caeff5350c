"""tracklake in a transformers (or TRL) Trainer.

``Trainer(..., callbacks=[TracklakeCallback()])`` works everywhere; importing this module
also makes ``report_to="tracklake"`` work in this process (transformers has no plug-in
registry, so only where it was imported). See docs/integrations.md.
"""

from tracklake._integrations.transformers import TracklakeCallback, register

register()

__all__ = ["TracklakeCallback", "register"]
