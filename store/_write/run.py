"""The public write API: `init()` and `Run`, the logging methods of one rank's handle on a
run (its lifecycle, `flush()` and `finish()`, are `RunHandle`'s, in finish.py)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracklake._format.attempt import (
    check_project_name,
    check_run_name,
    claim_attempt,
    now_iso,
    write_attempt,
)
from tracklake._format.liveness import process_identity
from tracklake._format.naming import (
    check_writable_root,
    resolve_rank,
    resolve_root,
    resolve_run_id,
    safe_name,
    world_size,
)
from tracklake._write import lifecycle as _lifecycle
from tracklake._write import media
from tracklake._write.blobs import artifact_items, store_blob
from tracklake._write.coerce import (
    check_key,
    coerce_metrics,
    flatten_config,
    jsonable,
)
from tracklake._write.finish import FinishReport, Lifecycle, RunHandle
from tracklake._write.histogram import DEFAULT_BINS, Histogram, binned, histogram
from tracklake._write.identity import capture, redact_config
from tracklake._write.media_budget import RunMedia
from tracklake._write.shipping import ship_folder
from tracklake._write.trace import Span

#: The range of the int64 columns (steps, token ids) and of the int32 ones (sample index).
INT64 = (-(1 << 63), (1 << 63) - 1)
INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64_MIN, _INT64_MAX = INT64


def _now_us() -> int:
    return time.time_ns() // 1000


class Run(RunHandle):
    """One rank's handle on a run. Create it with `tracklake.init()`."""

    def __init__(self, *, root: Path, project: str, run_id: str, name: str | None, rank: int,
                 attempt: int, attempt_path: Path, record: dict[str, Any],
                 writer_options: Mapping[str, Any]) -> None:
        super().__init__(root=root, project=project, run_id=run_id, name=name, rank=rank,
                         attempt=attempt, attempt_path=attempt_path, record=record,
                         writer_options=writer_options)
        self._step = -1  # last step used; log() without a step uses the next one
        self._known_keys: set[tuple[str, ...]] = set()
        self._last_keys: tuple[str, ...] = ()
        self._sidecars: Any = None  # tracklake._sidecar.Sidecars, with init(export=...)
        self._system: Any = None  # tracklake._write.system.SystemMetrics, when sampling
        self._media: RunMedia | None = None  # the run's media bytes, for its limit

    # -- metrics: the hot path ---------------------------------------------------------

    def log(self, metrics: Mapping[str, Any], *, step: int | None = None,
            histograms: bool = False) -> None:
        """Record metrics at `step` (default: one after the last step). Strings become texts.

        With `histograms=True`, an array or tensor of more than one element is recorded as
        a histogram (`log_histogram`, default bins); without, it is refused."""
        if self._state is not Lifecycle.RUNNING:
            self._refuse("log()")
        if type(metrics) is not dict and not isinstance(metrics, Mapping):
            raise TypeError(f"log() takes a mapping of metric names to values, not "
                            f"{type(metrics).__name__} {_short(metrics)}")
        if step is None:
            step = self._step + 1
        elif type(step) is not int:
            step = self._check_step(step)
        if not _INT64_MIN <= step <= _INT64_MAX:
            step = self._check_step(step)  # raises, naming the step
        values = list(metrics.values())
        arrays: dict[str, Any] | None = {} if histograms else None
        found: list[tuple[str, Histogram]] = []
        if not histograms and _plain_numbers(values):
            keys = tuple(metrics)
            if keys != self._last_keys:  # usually the same keys as the call before
                if keys not in self._known_keys:
                    for key in keys:
                        check_key(key)
                    self._known_keys.add(keys)
                self._last_keys = keys
        else:
            key_list, values, texts = coerce_metrics(metrics, arrays)
            keys = tuple(key_list)
            if arrays:  # computed before anything is recorded: a bad array refuses the call
                found = [(k, histogram(k, v)) for k, v in arrays.items()]
            for key, text in texts.items():
                self.log_text(key, text, step=step)
        self._step = step  # only once the call is known to be valid
        if values and not self._writer.add_metrics(step, time.time_ns() // 1000, keys, values):
            self._refuse("log()")  # finish() began while this call was being checked
        if found:
            self._add_histograms(found, step)

    def log_histogram(self, key: str, values: Any = None, *, step: int | None = None,
                      bins: int | Sequence[float] = DEFAULT_BINS, counts: Any = None) -> None:
        """Record the histogram of `values` (an array, a tensor on any device, a sequence of
        numbers) under `key` at `step` (default: the current step, 0 before any): its bin
        edges and counts, and its count, min, max, mean and std also as the metrics
        ``<key>/count`` ... ``<key>/std``. `bins`: how many (at most 512), or the edges.

        Already binned: ``counts=`` with `bins` the edges (one more than counts), as
        ``numpy.histogram`` returns them; the statistics are then those of the midpoints."""
        if self._state is not Lifecycle.RUNNING:
            self._refuse("log_histogram()")
        check_key(key, "histogram")
        if (values is None) == (counts is None):
            raise TypeError(f"log_histogram({key!r}) takes values, or counts with bins as "
                            "the edges")
        given = step is not None
        step = self._check_step(step) if given else max(self._step, 0)
        made = histogram(key, values, bins) if counts is None else binned(key, counts, bins)
        if given:
            self._step = step  # only once the call is known to be valid
        self._add_histograms([(key, made)], step)

    def _add_histograms(self, found: list[tuple[str, Histogram]], step: int) -> None:
        """One record group of histograms, and their statistics as one group of metrics."""
        t = _now_us()
        summary = {k: v for key, h in found for k, v in h.summary(key).items()}
        keys = tuple(summary)
        if keys not in self._known_keys:
            for key in keys:
                check_key(key)
            self._known_keys.add(keys)
        self._add("histograms", [h.row(key, step, t) for key, h in found])
        if not self._writer.add_metrics(step, t, keys, list(summary.values())):
            self._refuse("log_histogram()")

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """`ExperimentLogger.log_metrics`: the same as `log()`."""
        self.log(metrics, step=step)

    @staticmethod
    def _check_step(step: object) -> int:
        """`step` as an int that the int64 step column holds, else TypeError/ValueError."""
        if isinstance(step, bool) or not isinstance(step, int):
            index = getattr(step, "__index__", None)
            if index is None or isinstance(step, bool):
                raise TypeError(f"step must be an int, not {type(step).__name__} {step!r}")
            step = index()
        assert isinstance(step, int)
        if not INT64[0] <= step <= INT64[1]:
            raise ValueError(f"step {step} is outside the int64 range of the step column")
        return step

    def _start_system_metrics(self, interval: float) -> None:
        from tracklake._write.system import SystemMetrics

        self._system = SystemMetrics(interval, self._log_system, self._say_system)
        self._system.start()

    def _log_system(self, values: dict[str, float]) -> bool:
        """One sample of system metrics, at the current step (0 before any); False once
        the run takes no more values."""
        keys = tuple(values)
        if keys not in self._known_keys:
            for key in keys:
                check_key(key)
            self._known_keys.add(keys)
        return self._writer.add_metrics(max(self._step, 0), _now_us(), keys,
                                        list(values.values()))

    def _say_system(self, title: str, text: str) -> None:
        self._writer.add_rows("events", [{"time": _now_us(), "step": None, "level": "info",
                                          "kind": "system_metrics", "title": title,
                                          "text": text}])

    def finish(self, status: str = "finished", *, timeout: float = 30.0) -> FinishReport:
        if self._system is not None:
            self._system.stop()
        report = super().finish(status, timeout=timeout)
        sidecars, self._sidecars = self._sidecars, None
        if sidecars is not None:  # they drain and exit on their own; say so, do not wait
            sidecars.run_ended(report.status)
        return report

    finish.__doc__ = RunHandle.finish.__doc__

    # -- other records -----------------------------------------------------------------

    def _add(self, kind: str, rows: list[dict[str, Any]]) -> None:
        if self._state is not Lifecycle.RUNNING:
            self._refuse(f"logging {kind}")
        if self._writer.add_rows(kind, rows) is None:
            self._refuse(f"logging {kind}")

    def _resolve_step(self, step: int | None) -> int | None:
        return self._check_step(step) if step is not None else (
            self._step if self._step >= 0 else None)

    def log_config(self, config: Any) -> None:
        """Record a config (mapping, OmegaConf DictConfig, dataclass); nested keys joined by '/'."""
        flat = redact_config(flatten_config(config))
        t = _now_us()
        self._add("configs", [{"time": t, "key": k, "value": json.dumps(v, allow_nan=True)}
                              for k, v in flat.items()])

    def log_text(self, key: str, text: str, *, step: int | None = None) -> None:
        """Record a piece of text under `key`."""
        check_key(key, "text")
        if not isinstance(text, str):
            raise TypeError(f"text {key!r} must be str, not {type(text).__name__}")
        self._add("texts", [{"time": _now_us(), "step": self._resolve_step(step), "key": key,
                             "text": text}])

    def log_generations(self, samples: Sequence[Any], *, step: int | None = None,
                        key: str = "generations") -> None:
        """Record generated samples: mappings with input/output/score (and extra fields), or
        verl-style (input, output, score) tuples."""
        check_key(key, "generations")
        if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, Sequence):
            raise TypeError(f"{key}: samples must be a sequence of samples, not "
                            f"{type(samples).__name__}")
        if len(samples) > INT32[1]:
            raise ValueError(f"{key}: {len(samples)} samples in one call exceed the int32 "
                             "sample index")
        t = _now_us()
        resolved = self._resolve_step(step)
        rows: list[dict[str, Any]] = []
        for i, sample in enumerate(samples):
            rows.append(_generation_row(key, i, sample) | {"time": t, "step": resolved})
        self._add("generations", rows)

    def span(self, name: str, *, step: int | None = None, inputs: Any = None,
             token_ids: Sequence[int] | None = None, max_length: int | None = None,
             **attributes: Any) -> Span:
        """A context manager recording one trace span (nested spans become children)."""
        if self._state is not Lifecycle.RUNNING:
            self._refuse("span()")
        return Span(lambda row: self._add("traces", [row]), name,
                    step=None if step is None else self._check_step(step),
                    default_step=self._resolve_step(None), inputs=inputs,
                    token_ids=token_ids, attributes=attributes, max_length=max_length)

    def alert(self, title: str, text: str = "", *, level: str = "warning",
              step: int | None = None) -> None:
        """Record an alert event (exporters forward it where the destination has alerts)."""
        if level not in ("info", "warning", "error"):
            raise ValueError(f"alert level must be info, warning or error, not {level!r}")
        self._add("events", [{"time": _now_us(), "step": self._resolve_step(step),
                              "level": level, "kind": "alert", "title": str(title),
                              "text": str(text)}])

    def log_artifact(self, artifact: str | os.PathLike[str] | bytes, name: str | None = None,
                     *, media_type: str | None = None, metadata: Mapping[str, Any] | None = None,
                     step: int | None = None) -> str | None:
        """Store a file, a directory's files or bytes as content-addressed blobs.

        Returns the sha256 digest (of the last file for a directory), or None if the
        store could not be written (counted and reported like any write failure).
        """
        if self._state is not Lifecycle.RUNNING:
            self._refuse("log_artifact()")
        items = artifact_items(artifact, name)
        try:
            described = json.dumps(jsonable(dict(metadata or {})))
        except ValueError as exc:
            raise ValueError(f"metadata of artifact {name!r}: {exc}" if name else
                             f"an artifact's metadata: {exc}") from None
        digest = None
        rows = []
        for item_name, source in items:
            try:
                digest, size = store_blob(self.root, source)
            except OSError as exc:
                self._writer.record_failure(exc)
                return None
            rows.append({"time": _now_us(), "step": self._resolve_step(step), "name": item_name,
                         "digest": digest, "size": size, "media_type": media_type,
                         "metadata": described})
        self._add("artifacts", rows)
        return digest

    # -- media: images, audio, video -----------------------------------------------------

    def log_image(self, key: str, image: Any, *, step: int | None = None,
                  caption: str | None = None) -> str | None:
        """Store an image (a NumPy array HW/HWC, a torch tensor CHW/HWC, a PIL image, a
        PNG/JPEG/GIF/WebP file or its bytes) under `key`; its sha256, or None if the store
        could not be written. Arrays become PNG."""
        return self._log_media("log_image()", key, step, caption,
                               lambda limit: media.image_item(key, image, limit))

    def log_audio(self, key: str, audio: Any, *, sample_rate: int | None = None,
                  step: int | None = None, caption: str | None = None) -> str | None:
        """Store audio (an array of frames or frames x channels at `sample_rate`, or a
        WAV/FLAC/OGG/MP3 file or its bytes) under `key`. Arrays become 16-bit WAV."""
        return self._log_media("log_audio()", key, step, caption,
                               lambda limit: media.audio_item(key, audio, sample_rate, limit))

    def log_video(self, key: str, video: str | os.PathLike[str] | bytes, *,
                  fps: float | None = None, step: int | None = None,
                  caption: str | None = None) -> str | None:
        """Store a video (an MP4, WebM or GIF file or its bytes) under `key`."""
        return self._log_media("log_video()", key, step, caption,
                               lambda limit: media.video_item(key, video, fps, limit))

    def _log_media(self, call: str, key: str, step: int | None, caption: str | None,
                   make: Any) -> str | None:
        if self._state is not Lifecycle.RUNNING:
            self._refuse(call)
        check_key(key, "media")
        if caption is not None and not isinstance(caption, str):
            raise TypeError(f"media {key!r}: caption must be str, not {type(caption).__name__}")
        resolved = self._resolve_step(step)
        item_limit, run_limit = media.limits()
        item = make(item_limit)
        if self._media is None:
            self._media = RunMedia(self.root, self.project, self.id, self.rank,
                                   self.attempt)
        held = self._media.total()
        if held + item.size > run_limit:
            raise ValueError(
                f"media {key!r}: {item.size:,} bytes would bring run {self.id}'s media "
                f"(every rank and attempt) to {held + item.size:,}, more than the "
                f"{run_limit:,} a run may hold ({media.RUN_LIMIT_ENV} sets another limit); "
                "nothing was stored")
        try:
            digest, size = store_blob(self.root, item.data)
        except OSError as exc:
            self._writer.record_failure(exc)
            return None
        self._media.own += size
        self._add("media", [{
            "time": _now_us(), "step": resolved, "key": key, "type": item.type,
            "media_type": item.media_type, "digest": digest, "size": size,
            "caption": caption, "shape": None if item.shape is None else list(item.shape),
            "sample_rate": item.sample_rate, "fps": item.fps}])
        return digest


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain_numbers(values: list[Any]) -> bool:
    """True if `values` are Python ints, floats and bools (the fast path of `Run.log`).

    `sum()` runs in C and ends as exactly int or float only for those (NumPy and torch
    scalars keep their own types through the sum); str, None, mappings and arrays raise.
    A float()-able number with an odd `__radd__` (e.g. Fraction) may pass: the flush
    converts each value with float().
    """
    try:
        kind = type(sum(values))
    except (TypeError, OverflowError, ValueError):
        return False
    return kind is float or kind is int


def _generation_row(key: str, index: int, sample: Any) -> dict[str, Any]:
    if isinstance(sample, Mapping):
        fields = dict(sample)
    elif isinstance(sample, (tuple, list)) and 2 <= len(sample) <= 3:
        fields = dict(zip(("input", "output", "score"), sample, strict=False))
    else:
        raise TypeError(f"{key} sample {index} must be a mapping with input/output/score or an "
                        f"(input, output, score) tuple, not {type(sample).__name__}")
    row: dict[str, Any] = {"key": key, "sample": index}
    score = fields.pop("score", None)
    try:
        for col in ("input", "output"):
            value = fields.pop(col, None)
            row[col] = value if value is None or isinstance(value, str) else json.dumps(
                jsonable(value), ensure_ascii=False)
        extra = json.dumps(jsonable(fields), ensure_ascii=False) if fields else None
    except ValueError as exc:
        raise ValueError(f"{key} sample {index}: {exc}") from None
    if score is not None:
        from tracklake._write.coerce import to_float

        coerced = to_float(f"{key}[{index}].score", score)
        if isinstance(coerced, str):
            raise TypeError(f"{key} sample {index}: score must be a number, not str")
        score = coerced
    row["score"] = score
    row["extra"] = extra
    return row


def init(*, project: str, name: str | None = None, config: Any = None,
         root: str | os.PathLike[str] | None = None, run_id: str | None = None,
         rank: int | None = None, tags: Sequence[str] | None = None,
         flush_interval: float = 0.5, segment_bytes: int = 64 << 20,
         segment_seconds: float = 600.0, max_buffer_bytes: int = 256 << 20,
         fsync: bool = True, capture_identity: bool = True,
         compact: bool | None = None,
         export: Sequence[str] | Mapping[str, Mapping[str, Any] | None] | None = None,
         system_metrics: bool | float | None = None,
         local_root: str | os.PathLike[str] | None = None) -> Run:
    """Start (or resume, as a new attempt) a run and return this rank's `Run`.

    Sealed segments are compacted to Parquet by a detached low-priority process, started
    when a segment is sealed and at `finish()`; `compact=False` (or TRACKLAKE_COMPACT=0
    when `compact` is not given) leaves that to `tracklake compact`.

    `export` names destinations (``["wandb", "mlflow"]``, or a mapping of names to their
    `tracklake export` options): global rank 0 starts one exporter process per destination
    that follows this run and ends on its own after it (docs/exporters.md, "Sidecars").

    `system_metrics` (True, False or seconds between samples; default: on, every 10 s,
    unless TRACKLAKE_SYSTEM_METRICS says otherwise) samples CPU, memory, disk, network and
    NVIDIA GPUs into metrics under ``system/`` (docs/concepts.md, "System metrics").

    `local_root` (default $TRACKLAKE_LOCAL_ROOT; unset: off) is ship mode: the segments
    are written to that node-local folder and a thread moves their records into `root`
    (docs/many-nodes.md, "Write locally, ship segments").
    """
    from tracklake._write.compactor import compaction_wanted
    from tracklake._write.system import system_interval

    # settings refused before anything is written (a claimed attempt would show crashed)
    interval = system_interval(system_metrics)
    compact = compaction_wanted(compact)
    root_path = check_writable_root(resolve_root(root))
    local = ship_folder(local_root, root_path)
    given_project = project
    project = safe_name(project, "project")
    check_project_name(root_path, project, given_project)
    run = resolve_run_id(run_id, project, name)
    given_run = run_id if run_id is not None else os.environ.get("TRACKLAKE_RUN_ID") or None
    check_run_name(root_path, project, run, given_run)
    rank_n = resolve_rank(rank)
    sidecar_specs = None
    if export is not None:  # checked on every rank, before anything is written
        from tracklake._sidecar import plan_sidecars

        sidecar_specs = plan_sidecars(export, root=root_path.absolute(), project=project,
                                      run_id=run, pid=os.getpid())
    flat_config = redact_config(flatten_config(config)) if config is not None else {}
    root_path.mkdir(parents=True, exist_ok=True)
    attempt, path = claim_attempt(root_path, project, run, rank_n)
    record: dict[str, Any] = {
        "project": project, "project_given": given_project, "run": run,
        "run_given": given_run, "name": name,
        "rank": rank_n, "attempt": attempt,
        "world_size": world_size(),
        "tags": [str(t) for t in tags or ()], "status": "running",
        "started_at": now_iso(), "heartbeat_at": now_iso(), "finished_at": None,
        # the process is always named (liveness needs it), the rest only when captured
        "identity": capture() if capture_identity else process_identity(),
        "config": flat_config,
    }
    try:
        write_attempt(path, record, root=root_path)
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()  # give the attempt number back
        raise
    from tracklake._write.failures import say
    from tracklake._write.identity_notes import identity_notes

    for note in identity_notes(project=project, given_project=given_project, run=run,
                               run_id=run_id, attempt=attempt):
        say(note)
    r = Run(root=root_path, project=project, run_id=run, name=name, rank=rank_n,
            attempt=attempt, attempt_path=path, record=record,
            writer_options={"flush_interval": flush_interval, "segment_bytes": segment_bytes,
                            "segment_seconds": segment_seconds,
                            "max_buffer_bytes": max_buffer_bytes, "fsync": fsync,
                            "compact": compact, "local": local})
    if config is not None:
        r.log_config(config)
    _lifecycle.track(r)
    if interval is not None:
        r._start_system_metrics(interval)
    if sidecar_specs and rank_n == 0:
        from tracklake._sidecar import start_sidecars

        r._sidecars = start_sidecars(sidecar_specs, root=root_path.absolute(),
                                     run_label=f"{project}/{run}")
    return r


