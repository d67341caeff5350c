"""``wandb.util``: the one helper of W&B's that training code calls, `generate_id`."""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.ascii_lowercase + string.digits


def generate_id(length: int = 8) -> str:
    """A random run id of lowercase letters and digits, as W&B makes them."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))
