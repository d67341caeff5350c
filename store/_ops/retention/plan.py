"""The retention plan: which runs and kinds the policy removes or thins, and why, without
changing anything (docs/lifecycle.md gives the order in which the rules compose)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from tracklake._format import bounded_json
from tracklake._ops.backup.ledger import unbacked_files
from tracklake._ops.retention.inventory import (
    RunInfo,
    blobs_bytes,
    inventory,
    metric_extreme,
    pending_exports,
)
from tracklake._ops.retention.policy import Policy
from tracklake._read.reader import list_stream, list_streams

#: Parquet metadata key marking a downsampled metrics part (JSON: every, at).
DOWNSAMPLED_KEY = b"tracklake.downsampled"


@dataclass(frozen=True)
class Action:
    """One change to one run: delete it, drop some kinds, or downsample its metrics."""

    verb: str  # "delete", "drop" or "downsample"
    project: str
    run: str
    kinds: tuple[str, ...]
    bytes: int  # bytes the affected data takes now (what a delete or drop frees)
    rule: str
    why: str
    forced: bool = False

    @property
    def key(self) -> str:
        return f"{self.project}/{self.run}"


@dataclass(frozen=True)
class Skip:
    project: str
    run: str
    rule: str  # the rule that would have acted, or "" for a live run
    reason: str


@dataclass
class Plan:
    policy: Policy
    actions: list[Action] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (run key, why protected)
    store_bytes: int = 0

    @property
    def freed(self) -> int:
        return sum(a.bytes for a in self.actions if a.verb != "downsample")


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f} d"


def downsampled_already(root: Path, project: str, run: str, every: int) -> bool:
    """True when every metrics part of the run is downsampled by `every` (or more) and no
    segment is left: nothing more to thin."""
    for s in list_streams(root, project, run, ("metrics",)):
        files = list_stream(root, s)
        if files.segments:
            return False
        for part in files.parts:
            raw = (pq.read_schema(part.path).metadata or {}).get(DOWNSAMPLED_KEY)
            if raw is None or int(bounded_json.loads(raw)["every"]) < every:
                return False
    return True


def _best(root: Path, runs: list[RunInfo], policy: Policy) -> dict[str, str]:
    """Run key -> why it is among the best K of its project."""
    rule = policy.best
    if rule is None:
        return {}
    by_project: dict[str, list[tuple[float, RunInfo]]] = {}
    for r in runs:
        value = metric_extreme(root, r.project, r.run, rule.metric, rule.mode)
        if value is not None:
            by_project.setdefault(r.project, []).append((value, r))
    out: dict[str, str] = {}
    for ranked in by_project.values():
        ranked.sort(key=lambda vr: vr[0], reverse=rule.mode == "max")
        for i, (value, r) in enumerate(ranked[: rule.k]):
            out[r.key] = f"best: #{i + 1} of its project by {rule.mode} {rule.metric} = {value:g}"
    return out


def make_plan(root: Path, policy: Policy, now: float, force: Iterable[str] = ()) -> Plan:
    """What `policy` would do to the store at `root` now. `force` names runs (``RUN`` or
    ``PROJECT/RUN``) whose unexported data may go anyway."""
    forced = set(force)
    runs = inventory(root, now)
    plan = Plan(policy, store_bytes=sum(r.bytes for r in runs) + blobs_bytes(root))
    pending = pending_exports(root)
    best = _best(root, runs, policy)
    gone: set[str] = set()

    def blocked(r: RunInfo, kinds: tuple[str, ...], rule: str) -> bool:
        """True (and a Skip noted) if an exporter still has to export some of `kinds`, or
        the policy requires a backup and none holds them yet."""
        if r.key in forced or r.run in forced:
            return False
        if policy.require_backup and not_backed_up(r, kinds, rule):
            return True
        waiting = [(d, what) for d, what in pending.get((r.project, r.run), [])
                   if what.startswith("its state") or what.split(" ")[0].split("/")[2] in kinds]
        if not waiting:
            return False
        detail = "; ".join(f"exporter {d}: {what}" for d, what in waiting[:3])
        plan.skipped.append(Skip(r.project, r.run, rule, f"not exported yet ({detail}); "
                                 f"`--force {r.key}` drops it anyway"))
        return True

    def not_backed_up(r: RunInfo, kinds: tuple[str, ...], rule: str) -> bool:
        dirs = [root / k / f"project={r.project}" / f"run={r.run}" for k in kinds]
        if rule != "downsample_after" and rule != "drop_after":
            dirs.append(root / "runs" / f"project={r.project}" / f"run={r.run}")
        missing = unbacked_files(root, dirs)
        if not missing:
            return False
        plan.skipped.append(Skip(r.project, r.run, rule, (
            f"no backup holds {len(missing)} of its files yet (e.g. {missing[0]}); run "
            f"`tracklake backup DEST` first, or `--force {r.key}` removes it anyway")))
        return True

    def delete(r: RunInfo, rule: str, why: str) -> bool:
        kinds = tuple(sorted(k for k in r.kind_bytes if k != "runs"))
        if blocked(r, kinds, rule):
            return False
        plan.actions.append(Action("delete", r.project, r.run, kinds, r.bytes, rule, why,
                                   forced=r.key in forced or r.run in forced))
        gone.add(r.key)
        return True

    candidates: list[RunInfo] = []
    for r in runs:
        if r.live:
            plan.skipped.append(Skip(r.project, r.run, "", f"live: {r.live}"))
        elif r.pinned:
            plan.kept.append((r.key, "pinned (`tracklake pin` or a `keep` tag)"))
        elif r.key in best:
            plan.kept.append((r.key, best[r.key]))
            candidates.append(r)  # protected from deletion, still thinned
        else:
            candidates.append(r)
    deletable = [r for r in candidates if r.key not in best]

    if policy.max_age is not None:
        for r in deletable:
            age = now - r.ended
            if age > policy.max_age:
                delete(r, "max_age", f"ended {_days(age)} ago (> {_days(policy.max_age)})")
    if policy.keep_last is not None:
        by_project: dict[str, list[RunInfo]] = {}
        for r in runs:
            by_project.setdefault(r.project, []).append(r)
        for project_runs in by_project.values():
            project_runs.sort(key=lambda r: r.started, reverse=True)
            for i, r in enumerate(project_runs):
                if i >= policy.keep_last and r in deletable and r.key not in gone:
                    delete(r, "keep_last", f"#{i + 1} newest of project {r.project} "
                                           f"(keeping {policy.keep_last})")
    thinned: dict[str, int] = {}
    if policy.drop_after is not None:
        for r in candidates:
            age = now - r.ended
            kinds = tuple(k for k in policy.drop_kinds if r.kind_bytes.get(k))
            if r.key in gone or age <= policy.drop_after or not kinds:
                continue
            if blocked(r, kinds, "drop_after"):
                continue
            freed = sum(r.kind_bytes[k] for k in kinds)
            plan.actions.append(Action("drop", r.project, r.run, kinds, freed, "drop_after",
                                       f"ended {_days(age)} ago (> {_days(policy.drop_after)})",
                                       forced=r.key in forced or r.run in forced))
            thinned[r.key] = freed
    if policy.downsample_after is not None:
        for r in candidates:
            age = now - r.ended
            if (r.key in gone or age <= policy.downsample_after or not r.kind_bytes.get("metrics")
                    or downsampled_already(root, r.project, r.run, policy.downsample_every)):
                continue
            if blocked(r, ("metrics",), "downsample_after"):
                continue
            plan.actions.append(Action(
                "downsample", r.project, r.run, ("metrics",), r.kind_bytes["metrics"],
                "downsample_after", f"ended {_days(age)} ago (> {_days(policy.downsample_after)}"
                f"); keeping every {policy.downsample_every}th step and each key's first, last, "
                "min and max", forced=r.key in forced or r.run in forced))
    if policy.max_size is not None:
        total = plan.store_bytes - plan.freed
        for r in sorted(deletable, key=lambda r: r.ended):
            if total <= policy.max_size:
                break
            if r.key in gone:
                continue
            remaining = r.bytes - thinned.get(r.key, 0)
            if delete(r, "max_size", f"oldest run while the store holds {total:,} bytes "
                                     f"(> {policy.max_size:,})"):
                plan.actions[:] = [a for a in plan.actions
                                   if a.key != r.key or a.verb == "delete"]
                total -= remaining
    return plan
