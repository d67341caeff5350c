"""`tracklake demo --export [DEST]`: replay the demo's run into a destination on this
machine, through the same exporter loop as `tracklake export DEST`.

The destination is looked up by name in the exporter registry and configured through its
own command-line options, pointed at a directory beside the store (``ROOT-DEST`` unless
``--export-dir`` says otherwise; never inside the store): a log directory option gets that
directory, an MLflow tracking URI a SQLite file in it, a mode option ``offline``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tracklake._errors import ExportError

_DIRECTORY_OPTIONS = frozenset({"logdir", "log_dir", "dir", "output_dir"})

#: How to look at what a destination wrote ({out}: the directory, {uri}: the SQLite URI).
_LOOK: Mapping[str, Sequence[str]] = {
    "tensorboard": ["tensorboard --logdir {out}"],
    "mlflow": ["mlflow ui --backend-store-uri {uri}"],
    "wandb": ["WANDB_RESUME=allow wandb sync {out}/wandb   # uploads the offline runs to W&B"],
    "swanlab": ["swanlab sync --id ID {out}/run-ID-tracklakeN   # uploads; each N in order",
                "# a local dashboard: pip install 'swanlab[dashboard]', export with --mode "
                "local, then: swanlab watch DIR"],
}

POINTS_SQL = """
SELECT count(*) AS points, count(DISTINCT key) AS keys, min(step) AS first, max(step) AS last
FROM metrics WHERE project = $project AND run = $run AND rank = 0
"""


def default_dir(root: Path, name: str) -> Path:
    """Where the demo exports to unless told: beside the store, ``<root>-<destination>``."""
    return root.with_name(f"{root.name}-{name}")


def shown(path: Path) -> str:
    """`path` as printed: relative to the current directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def sqlite_uri(directory: str) -> str:
    """The MLflow tracking URI of a database file in `directory`."""
    return f"sqlite:///{directory}/mlflow.db"


def local_arguments(options: Sequence[click.Parameter], out: str) -> list[str]:
    """Arguments for a destination's own options that keep its output in `out`."""
    arguments: list[str] = []
    for option in options:
        if not isinstance(option, click.Option) or not option.opts:
            continue
        if option.name in _DIRECTORY_OPTIONS:
            arguments += [option.opts[0], out]
        elif option.name == "tracking_uri":
            arguments += [option.opts[0], sqlite_uri(out)]
        elif option.name == "artifact_root":
            arguments += [option.opts[0], f"{out}/artifacts"]
        elif (option.name == "mode" and isinstance(option.type, click.Choice)
              and "offline" in option.type.choices):
            arguments += [option.opts[0], "offline"]
    return arguments


@dataclass
class DemoExport:
    """A destination made ready before the demo runs, so that a bad name fails at once."""

    name: str
    out: Path
    destination: Any
    params: dict[str, Any]
    arguments: list[str]  # as printed, for the equivalent `tracklake export` command

    def run(self, root: Path, *, project: str, run_id: str) -> str:
        """Export the run (rank 0) and return what to print: a summary and how to look."""
        from tracklake._read.query import query
        from tracklake.exporters import ExportOptions, Selection, export

        self.out.mkdir(parents=True, exist_ok=True)
        summary = export(self.destination, root=root,
                         selection=Selection(project=project, runs=(run_id,)),
                         options=ExportOptions(give_up_after=30.0))
        again = shlex.join(["tracklake", "export", self.name, "--root", shown(root),
                            "--run", run_id, *self.arguments])
        outcome = summary.runs.get(f"{project}/{run_id}")
        if outcome is None or outcome.error:
            why = outcome.error if outcome else "the run was not found in the store"
            raise ExportError(f"exporting {project}/{run_id} to {summary.destination} failed: "
                              f"{why}; try again with: {again}", retryable=False)
        points = query(POINTS_SQL, root=root, params={"project": project, "run": run_id})
        row = points.to_pylist()[0]
        lines = [f"exported {outcome.run} (rank 0) to {summary.destination}: "
                 f"{outcome.records:,} records, {row['points']:,} metric points of "
                 f"{row['keys']} keys, steps {row['first']}..{row['last']}"
                 + ("" if outcome.finished else " (run not finished)")]
        lines.append(f"same as: {again}")
        out = shlex.quote(shown(self.out))
        looks = _LOOK.get(self.name, [f"tracklake export {self.name} --help   # where it went"])
        lines.append("look at it:")
        lines += ["  " + look.format(out=out, uri=shlex.quote(sqlite_uri(shown(self.out))))
                  for look in looks]
        return "\n".join(lines)


def plan_export(name: str, root: Path, out: Path | None) -> DemoExport:
    """Load and configure destination `name` (a click error names what is wrong)."""
    from tracklake._cli.export import make_destination, missing_package
    from tracklake.exporters import load

    try:
        cls = load(name)
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="'--export'") from exc
    except ImportError as exc:
        raise click.ClickException(missing_package(name, exc)) from exc
    out = (out or default_dir(root, name)).absolute()
    if out.resolve().is_relative_to(root.resolve()):
        raise click.BadParameter(f"{out} is inside the store {root}; choose a directory "
                                 "outside it", param_hint="'--export-dir'")
    options: list[click.Parameter] = cls.cli_options()
    try:
        context = click.Command(name, params=options).make_context(
            f"tracklake export {name}", local_arguments(options, str(out)))
    except click.UsageError as exc:
        raise click.UsageError(
            f"the demo cannot configure the {name} exporter by itself ({exc.format_message()}); "
            f"run `tracklake export {name} --help` and export the demo's run with it") from exc
    return DemoExport(name, out, make_destination(cls, context.params), dict(context.params),
                      local_arguments(options, shown(out)))


