"""MLflow's, requests' and the file system's errors as ExportError, retryable or not by
the error's code (never its message)."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from tracklake import ExportError
from tracklake.exporters._protocol import RunInfo

#: MLflow HTTP statuses worth retrying besides 5xx (501 Not Implemented is not).
_RETRY_STATUSES = frozenset({408, 429})
_PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG})


@contextlib.contextmanager
def boundary(destination: str, run: RunInfo, what: str) -> Iterator[None]:
    """Translate MLflow's, requests' and the file system's errors to ExportError."""
    import requests
    from mlflow.exceptions import MlflowException

    try:
        yield
    except (MlflowException, requests.RequestException, OSError) as exc:
        message = exc.message if isinstance(exc, MlflowException) else str(exc)
        raise ExportError(f"{destination}: {what} of {run.key} failed: {message}",
                          retryable=_retryable(exc)) from exc
    except Exception as exc:
        if not _is_database_error(exc):
            raise
        # a database URI: locked, or migrated by another process right now
        raise ExportError(f"{destination}: {what} of {run.key} failed: the database said "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                          retryable=True) from exc


def _is_database_error(exc: BaseException) -> bool:
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:  # mlflow-skinny: no database URIs
        return False
    return isinstance(exc, SQLAlchemyError)


def _retryable(exc: BaseException) -> bool:
    """Whether trying again later can help, from the error's code (never its message)."""
    from mlflow.exceptions import MlflowException

    status: int | None = None
    if isinstance(exc, MlflowException):
        # unannotated in mlflow 3.17 (returns the int HTTP status of exc.error_code)
        status = int(exc.get_http_status_code())  # type: ignore[no-untyped-call]
    else:
        import requests

        if isinstance(exc, requests.HTTPError) and exc.response is not None:
            status = exc.response.status_code
        elif isinstance(exc, (requests.ConnectionError, requests.Timeout,
                              requests.exceptions.ChunkedEncodingError,
                              requests.exceptions.RetryError)):
            return True
        elif isinstance(exc, requests.RequestException):
            return False  # a malformed URL, schema or header
        elif isinstance(exc, OSError):
            return exc.errno not in _PERMANENT_ERRNOS
    if status is None:
        return True
    return (status >= 500 and status != 501) or status in _RETRY_STATUSES
