"""Bytes on disk per histogram and per image: tracklake against TensorBoard's and W&B's
own files for the same data (run by ``benchmarks/write_path.py --media-bytes``).

The data: ``steps`` x ``keys`` histograms of 64 bins, each of 10,000 values drawn once from
``numpy.random.default_rng(seed)``. Every writer gets the same bins (NumPy's, computed
once): tracklake ``run.log_histogram(key, values, bins=64)``; TensorBoard through
``torch.utils.tensorboard.SummaryWriter.add_histogram(key, values, step, bins=64)`` (the
``HistogramProto`` that TensorBoard writers without TensorFlow write); W&B offline
``wandb.log({key: wandb.Histogram(np_histogram=(counts, edges))}, step=step)``.

Reported per writer, divided by the number of histograms: the bytes of the histograms'
own files where they are apart (tracklake's ``histograms/`` kind after compaction) and
of the whole directory after finishing (tracklake's store includes the five statistics
per histogram as metrics, the run's attempt file and nothing else; W&B's run directory
includes its config and metadata files; TensorBoard's is its event file).

Images: ``steps`` RGB images of 64x64 (a gradient with noise, as PNG in every writer:
tracklake ``run.log_image(key, array)``, TensorBoard ``add_image(..., dataformats="HWC")``,
W&B ``wandb.Image(array)``), once all different and once the same image at every step,
where tracklake stores the bytes once.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Measured:
    writer: str
    histograms: int
    own_bytes: int | None  # the histograms' own files, where they are apart
    total_bytes: int  # the whole directory
    note: str = ""

    def per(self, n: int | None) -> str:
        return "-" if n is None else f"{n / self.histograms:,.0f}"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _data(steps: int, keys: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.normal(loc=k, scale=1 + step / steps, size=10_000) for k in range(keys)]
            for step in range(steps)]


def _tracklake(data: list[list[np.ndarray]], tmp: Path) -> Measured:
    import tracklake

    root = tmp / "tracklake"
    with tracklake.init(project="bench", run_id="hist", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step, values in enumerate(data):
            for k, v in enumerate(values):
                run.log_histogram(f"layer{k}/weights", v, step=step, bins=64)
    tracklake.compact(root=root)
    shutil.rmtree(root / ".cache", ignore_errors=True)  # derived caches, not data
    n = len(data) * len(data[0])
    return Measured("tracklake (compacted)", n, _size(root / "histograms"), _size(root),
                    "own = histograms/ parts; total adds 5 statistics as metrics each")


def _tensorboard(data: list[list[np.ndarray]], tmp: Path) -> Measured:
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp / "tensorboard"
    writer = SummaryWriter(log_dir=str(logdir))
    for step, values in enumerate(data):
        for k, v in enumerate(values):
            writer.add_histogram(f"layer{k}/weights", v, step, bins=64)
    writer.close()
    n = len(data) * len(data[0])
    return Measured("tensorboard (torch SummaryWriter)", n, None, _size(logdir),
                    "empty end bins dropped by the writer")


@contextlib.contextmanager
def _wandb_run(directory: Path) -> Iterator[Any]:
    """An offline W&B run in `directory` without system stats, metadata, git, code or
    console capture (files that are not the logged data), finished on leaving."""
    import wandb

    directory.mkdir()
    with contextlib.redirect_stdout(sys.stderr):
        run = wandb.init(mode="offline", dir=str(directory), project="tracklake-bench",
                         settings=wandb.Settings(x_disable_stats=True, x_disable_meta=True,
                                                 disable_git=True, disable_code=True,
                                                 console="off"))
        yield run
        run.finish()


def _wandb(data: list[list[np.ndarray]], tmp: Path) -> Measured:
    import wandb

    directory = tmp / "wandb"
    with _wandb_run(directory) as run:
        for step, values in enumerate(data):
            row: dict[str, Any] = {}
            for k, v in enumerate(values):
                counts, edges = np.histogram(v, bins=64)
                row[f"layer{k}/weights"] = wandb.Histogram(np_histogram=(counts, edges))
            run.log(row, step=step)
    n = len(data) * len(data[0])
    [log] = directory.rglob("*.wandb")
    return Measured("wandb offline", n, log.stat().st_size, _size(directory),
                    "own = the run's .wandb transaction log")


def _images(steps: int, same: bool, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, 64)[None, :, None] + np.linspace(0, 50, 64)[:, None, None]
    images = []
    for step in range(steps):
        noise = rng.integers(0, 8, (64, 64, 3)) if not same or step == 0 else None
        images.append(images[0] if noise is None else (ramp + noise).astype(np.uint8))
    return images


def _tracklake_images(images: list[np.ndarray], tmp: Path) -> Measured:
    import tracklake

    root = tmp / "tracklake"
    with tracklake.init(project="bench", run_id="img", root=root, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step, image in enumerate(images):
            run.log_image("samples", image, step=step)
    tracklake.compact(root=root)
    shutil.rmtree(root / ".cache", ignore_errors=True)
    return Measured("tracklake (compacted)", len(images), _size(root / "blobs"), _size(root),
                    "own = blobs (PNG); total adds the media records")


def _tensorboard_images(images: list[np.ndarray], tmp: Path) -> Measured:
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp / "tensorboard"
    writer = SummaryWriter(log_dir=str(logdir))
    for step, image in enumerate(images):
        writer.add_image("samples", image, step, dataformats="HWC")
    writer.close()
    return Measured("tensorboard (torch SummaryWriter)", len(images), None, _size(logdir),
                    "PNG inside the event file")


def _wandb_images(images: list[np.ndarray], tmp: Path) -> Measured:
    import wandb

    directory = tmp / "wandb"
    with _wandb_run(directory) as run:
        for step, image in enumerate(images):
            run.log({"samples": wandb.Image(image)}, step=step)
    [media] = directory.rglob("files/media")
    return Measured("wandb offline", len(images), _size(media), _size(directory),
                    "own = its media/ PNG files")


def _each_writer(writers: tuple[Callable[[Any, Path], Measured], ...], data: Any
                 ) -> list[Measured]:
    """Each writer's measure of `data`, in a temporary directory of its own (a writer
    that is not installed is left out, said on stderr)."""
    base = Path(tempfile.mkdtemp(prefix="tracklake-media-bytes-"))
    out = []
    try:
        for writer in writers:
            try:
                out.append(writer(data, base))
            except ImportError as exc:
                print(f"{writer.__name__[1:]}: skipped ({exc})", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def image_bytes(steps: int = 200, same: bool = False, seed: int = 20240611
                ) -> list[Measured]:
    """Each writer's bytes for the same `steps` images (`same`: one image at every step)."""
    return _each_writer((_tracklake_images, _tensorboard_images, _wandb_images),
                        _images(steps, same, seed))


def histogram_bytes(steps: int = 200, keys: int = 4, seed: int = 20240611) -> list[Measured]:
    """Each writer's bytes for the same `steps` x `keys` histograms."""
    return _each_writer((_tracklake, _tensorboard, _wandb), _data(steps, keys, seed))


def print_bytes(title: str, results: list[Measured]) -> None:
    print(title)
    print(f"  {'writer':<36} {'own files':>10} {'directory':>10}  note")
    for r in results:
        print(f"  {r.writer:<36} {r.per(r.own_bytes):>10} {r.per(r.total_bytes):>10}  {r.note}")


def main(steps: int = 200) -> dict[str, list[Measured]]:
    """Every comparison, printed; the measures by name."""
    found = {"histograms": histogram_bytes(steps=steps),
             "images": image_bytes(steps=steps),
             "same image at every step": image_bytes(steps=steps, same=True)}
    print_bytes(f"bytes per histogram (64 bins of 10,000 values; {steps * 4:,} histograms):",
                found["histograms"])
    print_bytes(f"bytes per image (64x64 RGB; {steps:,} images):", found["images"])
    print_bytes(f"bytes per image, the same image at each of {steps:,} steps:",
                found["same image at every step"])
    return found


if __name__ == "__main__":
    main()
