"""The SwanLab SDK's errors that the export loop may retry, or must stop on, as ExportError.

The table, by type (never by message):

- ``swanlab.exceptions.AuthenticationError``: SwanLab 0.10 raises it for a wrong key and
  for an unreachable server alike; a wrong key never succeeds → not retryable (the message
  says what to check; ``--follow`` tries again at each poll);
- ``swanlab.exceptions.ApiError``: the service answered; its own ``retryable`` decides;
- ``requests``' other errors: transport → retryable;
- ``pydantic.ValidationError``: SwanLab refused the settings we built → not retryable;
- ``swanlab.exceptions.DataStoreError`` (its local log files) and ``OSError``: retryable
  unless a permission, a read-only file system or a name too long.

Anything else (a ``TypeError`` from building rows, say) is a bug of ours or an error the
table does not know: it is re-raised untouched, and the export stops with its traceback.
"""

from __future__ import annotations

import pydantic
import requests
import swanlab  # type: ignore[import-untyped, unused-ignore]  # ships no type information
from swanlab.exceptions import (  # type: ignore[import-untyped, unused-ignore]
    ApiError,
    AuthenticationError,
    DataStoreError,
)

from tracklake import ExportError
from tracklake.exporters._shared.errors import os_error_retryable


def translate(exc: Exception, message: str) -> ExportError:
    """`exc` as an ExportError saying `message` and whether retrying can help; an error
    outside the table is raised again as it is."""
    if isinstance(exc, ExportError):
        return exc
    if isinstance(exc, AuthenticationError):
        host = swanlab.Settings().api_host
        return ExportError(f"{message}: SwanLab could not log in at {host} ({exc}): the API "
                           "key is wrong or the server cannot be reached; check "
                           "SWANLAB_API_KEY, SWANLAB_API_HOST and the network (HTTPS_PROXY), "
                           "then export again", retryable=False)
    if isinstance(exc, ApiError):
        return ExportError(f"{message}: SwanLab answered {exc}", retryable=exc.retryable)
    if isinstance(exc, requests.RequestException):
        return ExportError(f"{message}: cannot reach SwanLab ({exc}); check the network, "
                           "HTTPS_PROXY and SWANLAB_API_HOST", retryable=True)
    if isinstance(exc, pydantic.ValidationError):
        return ExportError(f"{message}: SwanLab refused the run's settings: {exc}",
                           retryable=False)
    if isinstance(exc, DataStoreError):
        return ExportError(f"{message}: SwanLab could not write its files: {exc}",
                           retryable=True)
    if isinstance(exc, OSError):
        return ExportError(f"{message}: {exc}", retryable=os_error_retryable(exc))
    raise exc
