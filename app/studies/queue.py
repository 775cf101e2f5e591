"""A study's runs, queued: each seed × repeat × group (stack or arm) × determinism level, in the order
they are leased. Creating a study (:mod:`steady.server.studies.service`) queues its first stage; an adaptive
study (:mod:`steady.server.studies.adaptive`) queues each next one.
"""

from __future__ import annotations

from itertools import product

from steady.server.kit.db import WriteSession
from steady.server.models import Study, utcnow
from steady.server.runs import repository as runs_repo
from steady.server.stats.cost import balanced_level_order
from steady.server.studies.schemas import StudySpec
from steady.worker.contract.protocol import RunStatus


def _chosen(spec: StudySpec, groups: list[str] | None) -> list:
    """The spec's groups (stacks or arms) that get runs: all, or those named in ``groups``."""
    return [g for g in spec.groups if groups is None or g.name in groups]


def runs_per_seed(spec: StudySpec, groups: list[str] | None = None) -> int:
    """How many runs :func:`insert_runs` queues per seed (repeats × groups × determinism levels)."""
    return spec.repeats * len(_chosen(spec, groups)) * len(spec.determinism)


def insert_runs(session: WriteSession, study: Study, spec: StudySpec, seeds: list[int],
                groups: list[str] | None = None) -> None:
    """Queue the runs of ``seeds``: each seed × repeat × group (stack or arm) × determinism level; ``groups``:
    only the groups of these names (a sources study's next stage grows only its undecided arms)."""
    assert spec.workload is not None
    framework = spec.workload.framework.value
    # Runs are leased in id order, so the insert order is the execution order. The levels
    # are interleaved (one block per seed × repeat, alternating direction: A B C, C B A, …)
    # so that a drift in machine load over the study does not read as a cost of determinism
    # (steady.server.stats.cost). Before, every run of one level ran as one block.
    blocks = list(product(seeds, range(spec.repeats)))
    rows = [
        {
            "study_id": study.id,
            "seed": seed,
            "repeat": repeat,
            "determinism": level.value,
            "stack": stack.name,
            "framework": framework,
            "required_labels": sorted({framework, *stack.labels}),
            "status": RunStatus.queued.value,
            "attempt": 0,
            "max_attempts": spec.max_attempts,
            "cancel_requested": False,
            "fingerprint": {},
            "digests": {},
            "determinism_applied": {},
            "timings": {},
            "final_metrics": {},
            "created_at": utcnow(),
        }
        for (seed, repeat), levels in zip(blocks, balanced_level_order(spec.determinism, len(blocks)))
        for stack in _chosen(spec, groups)
        for level in levels
    ]
    runs_repo.insert_runs(session, rows)
