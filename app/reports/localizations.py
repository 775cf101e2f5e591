"""Where repeats parted, as `steady localize` found it: stored per pair of runs on the study, shown in
the repeatability verdict of the group the pair belongs to.

The replays run where the user's code can run (`steady localize` on the user's machine, which holds the
code and the framework); the server checks the pair and keeps the answer. Recording one changes the
study (``updated_at``), so a cached report is computed again with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from steady.server.kit.auth import Caller
from steady.server.kit.db import WriteSession
from steady.server.kit.errors import Invalid
from steady.server.models import Run, Study, utcnow
from steady.server.reports.parts import Localization
from steady.server.runs import repository as runs_repo
from steady.server.studies import service as studies

MAX_KEPT = 50  # localizations kept per study (the newest)


def check_pair(session: Session, study_id: int, run_ids: list[int], field: tuple[str, ...]) -> tuple[Run, Run]:
    """The two runs, if they are two different repeats (same seed, determinism and stack) of the study;
    422 naming ``field`` otherwise."""
    if len(run_ids) != 2:
        raise Invalid(field, f"two runs, the repeats to compare; got {len(run_ids)}")
    a_id, b_id = run_ids
    if a_id == b_id:
        raise Invalid(field, "two different runs: a run cannot part from itself")
    runs = []
    for i, run_id in enumerate(run_ids):
        run = runs_repo.find_run(session, run_id)
        if run is None or run.study_id != study_id:
            raise Invalid((*field, i), f"run {run_id} is not a run of study {study_id}")
        runs.append(run)
    a, b = runs
    if (a.seed, a.determinism, a.stack) != (b.seed, b.determinism, b.stack):
        raise Invalid(field, f"runs {a_id} and {b_id} are not repeats of one another (seed, "
                      f"determinism and stack must match: {a.seed}/{a.determinism}/{a.stack} vs "
                      f"{b.seed}/{b.determinism}/{b.stack})")
    return a, b


def record(session: WriteSession, study_id: int, body: Localization, caller: Caller) -> Localization:
    """Keep ``body`` for its pair of runs (replacing an earlier one for the same pair)."""
    study = studies.get_study(session, study_id)
    studies.ensure_study_owner(study, caller)
    return keep(session, study, body)


def keep(session: WriteSession, study: Study, body: Localization) -> Localization:
    """Check ``body`` and keep it on ``study`` (the caller checked who may): what `steady localize` posts and
    what a worker's replay of a localization job answers are kept alike."""
    check_pair(session, study.id, body.run_ids, ("body", "run_ids"))
    if body.status == "localized" and body.answer is None:
        raise Invalid(("body", "answer"), "a localized pair needs its answer (the op, module, phase and line)")
    if body.status == "localized" and body.answer is not None and body.step != body.answer.step:
        raise Invalid(("body", "step"), f"step {body.step} is not the answer's step {body.answer.step}")
    stored = body.model_copy(update={"localized_at": utcnow()})
    pair = sorted(body.run_ids)
    kept = [e for e in (study.localizations or []) if sorted(e.get("run_ids") or []) != pair]
    study.localizations = [*kept, stored.model_dump(mode="json")][-MAX_KEPT:]
    study.updated_at = utcnow()
    session.flush()
    return stored


def of_study(study: Study) -> list[Localization]:
    out = []
    for entry in study.localizations or []:
        try:
            out.append(Localization.model_validate(entry))
        except ValueError:  # written by an older shape: left out, not a 500
            continue
    return out


def attach(report: Any, study: Study) -> None:
    """Give each repeatability verdict the newest localization of a pair among its runs."""
    found = of_study(study)
    if not found:
        return
    for v in report.of_level("repeatability"):
        ids = {r for s in v.per_seed for r in s.run_ids}
        mine = [loc for loc in found if set(loc.run_ids) <= ids]
        if mine:
            v.localization = mine[-1]


def localizations(session: Session, study_id: int) -> list[Localization]:
    return of_study(studies.get_study(session, study_id))
