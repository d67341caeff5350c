"""The W&B SDK's errors that the export loop may retry, or must stop on, as ExportError.

The table, by type (never by message):

- ``wandb.errors.UsageError`` (and ``UnsupportedError``), ``AuthenticationError``: the
  call or the credentials are wrong; waiting cannot help → not retryable;
- ``wandb.errors.CommError`` and the other ``wandb.errors.Error``s (the wandb-core
  service did not start or answer), ``requests``' errors: transport and service → retryable;
- ``OSError``: retryable unless it is a permission, a read-only file system or a name
  too long.

Anything else (a ``TypeError`` from building rows, say) is a bug of ours or an error the
table does not know: it is re-raised untouched, and the export stops with its traceback.
"""

from __future__ import annotations

import requests
import wandb

from tracklake import ExportError
from tracklake.exporters._shared.errors import os_error_retryable

_PERMANENT = (wandb.errors.UsageError, wandb.errors.AuthenticationError)


def translate(exc: Exception, message: str) -> ExportError:
    """`exc` as an ExportError saying `message: exc` and whether retrying can help; an
    error outside the table is raised again as it is."""
    if isinstance(exc, ExportError):
        return exc
    if isinstance(exc, _PERMANENT):
        return ExportError(f"{message}: {exc}", retryable=False)
    if isinstance(exc, (wandb.errors.Error, requests.RequestException)):
        return ExportError(f"{message}: {exc}", retryable=True)
    if isinstance(exc, OSError):
        return ExportError(f"{message}: {exc}", retryable=os_error_retryable(exc))
    raise exc
