"""The rank under which a process without a rank of its own records rollout traces.

verl runs its agent loops in Ray actors (``AgentLoopWorker``) that have no ``RANK``: left
to the default rank 0 they would write the trainer's rank-0 stream, and, since each rank
numbers its attempts itself, make attempts that hide the trainer's steps. Their ranks are
taken from a range no trainer reaches, the same in every attempt of a job so that a
restarted job's traces are a new attempt of the same streams (docs/verl.md):

- verl's agent-loop worker ``i`` (Ray actor ``agent_loop_worker_<i>_<hex>``):
  ``AGENT_LOOP_RANK_BASE + i``;
- any other Ray actor: its ``$RANK`` if it has one (a worker group's own rank), else
  ``OTHER_ACTOR_RANK_BASE`` plus a hash of its actor id (different actors collide with
  probability about n²/2³²);
- outside Ray: the process's rank as `tracklake.init` resolves it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping

from tracklake._format.naming import MAX_RANK, resolve_rank

#: First rank of verl's agent-loop workers: above any trainer's world size.
AGENT_LOOP_RANK_BASE = 1 << 20
#: First rank of other Ray actors without $RANK (AGENT_LOOP_RANK_BASE + 2^20 workers below).
OTHER_ACTOR_RANK_BASE = 1 << 21
_AGENT_LOOP_ACTOR = re.compile(r"agent_loop_worker_(\d{1,7})_[0-9a-f]+")


def rollout_rank(env: Mapping[str, str] = os.environ) -> int:
    """This process's rank for rollout traces (the rules are in the module docstring)."""
    actor_id, actor_name = _ray_actor()
    return rank_for(actor_id, actor_name, env)


def rank_for(actor_id: str | None, actor_name: str | None,
             env: Mapping[str, str] = os.environ) -> int:
    """The rank of the Ray actor `actor_id` named `actor_name` (None: not an actor)."""
    if actor_id is None:
        return resolve_rank(None, env)
    match = _AGENT_LOOP_ACTOR.fullmatch(actor_name or "")
    if match is not None and int(match[1]) < OTHER_ACTOR_RANK_BASE - AGENT_LOOP_RANK_BASE:
        return AGENT_LOOP_RANK_BASE + int(match[1])
    if env.get("RANK", "").isdigit():
        return resolve_rank(None, env)
    digest = int.from_bytes(hashlib.sha256(actor_id.encode()).digest()[:8], "big")
    return OTHER_ACTOR_RANK_BASE + digest % (MAX_RANK - OTHER_ACTOR_RANK_BASE + 1)


def _ray_actor() -> tuple[str | None, str | None]:
    """(actor id, actor name) when this process is a Ray actor, else (None, None).

    Ray is looked at only if the process already imported it (verl's workers have).
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None, None
    context = ray.get_runtime_context()
    actor_id = context.get_actor_id()
    if actor_id is None:
        return None, None
    return str(actor_id), context.get_actor_name()
