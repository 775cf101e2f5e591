"""Suite baselines as frozen, content-addressed snapshots.

Setting a baseline copies what the comparisons read of its runs — per run: seed, repeat,
determinism level, stack, digests, logged dtypes, every metric's series of the study's spec and
its final value — into one canonical JSON document, stored with its SHA-256 digest. The
``out_of_baseline`` and ``not_equivalent`` alert rules and ``GET /suites/{suite}/baseline/compare``
(``steady check --against``) read the snapshot, never the live rows: excluding, re-running or
adding a run of the baseline study afterwards changes no comparison. Moving the baseline is an
explicit act that adds a version (who, when, why); older versions stay readable as history. Clearing
it (``DELETE``) adds a version too, a "cleared" one without content, so the history says who left
the suite without a baseline, when and why. Only a settled study is frozen: a queued or running one
would freeze whichever of its runs happened to have finished (409 naming ``study_id``).

Canonical JSON: keys sorted, no whitespace, UTF-8. Final values are JSON numbers (Python's
shortest round-trip ``repr``, so exact), non-finite ones the strings ``"nan"``, ``"inf"`` and
``"-inf"`` (this stored format's own spelling, kept so equal content keeps its digest; snapshots
are not served as they are, and the API spells these as ``steady.server.kit.wire`` does). A series is
``{"n", "steps", "values"}`` with steps as
little-endian int64 and values as little-endian IEEE-754 float64, base64-encoded: exact bit
for bit (NaN payloads and signed zeros included), and about 4x faster to snapshot than a
list of decimal numbers (bench/baseline_snapshot_bench.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import zlib
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from steady.server.alerts import repository
from steady.server.alerts.schemas import BaselineIn, BaselineOut
from steady.server.kit.auth import Caller, ensure_may_change
from steady.server.kit.errors import Conflict, Invalid, NotFound, judging
from steady.server.models import BaselineSnapshot, Study, SuiteBaseline, utcnow
from steady.worker.contract.protocol import RunStatus, StudyStatus
from steady.server.reports import service as reports
from steady.server.reports.models import typed_verdicts, verdicts_of
from steady.server.reports.parts import PairGroup
from steady.server.studies import service as studies
from steady.server.stats.report import MetricSpec, RunData, build_report

FORMAT = 1
BASELINE_STACK = "baseline"  # the stack name the baseline's runs take in a comparison


def _plain(x: float) -> float | str:
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def digest_of(doc: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(doc)).hexdigest()


def snapshot_document(session: Session, study: Study, stack: str | None) -> dict[str, Any]:
    """The baseline's content: the study's judged runs (completed, not excluded) on ``stack`` (or all)."""
    runs = reports.completed_runs(session, study.id)
    if stack is not None:
        runs = [r for r in runs if r.stack == stack]
    metrics = [m.name for m in reports.metric_specs(study)]
    data = reports.run_data(session, runs, metrics)
    out = []
    for r in data:
        series, final = {}, {}
        for key, (steps, values) in sorted(r.series.items()):
            series[key] = {"n": len(values), "steps": _b64(np.asarray(steps, dtype="<i8")),
                           "values": _b64(np.asarray(values, dtype="<f8"))}
            if len(values):
                final[key] = _plain(values[-1])
        out.append({"run_id": r.run_id, "seed": r.seed, "repeat": r.repeat, "determinism": r.determinism,
                    "stack": r.stack, "digests": dict(r.digests or {}), "dtypes": dict(r.dtypes or {}),
                    "final": final, "series": series})
    return {"format": FORMAT, "study_id": study.id, "stack": stack, "metrics": metrics, "runs": out}


_DECODED: dict[str, dict[str, Any]] = {}  # by digest: a snapshot never changes, so decoded ones are kept
_DECODED_MAX = 8
_DECODED_LOCK = threading.Lock()


def document(snapshot: BaselineSnapshot) -> dict[str, Any]:
    """The snapshot's content (read-only: it is shared between the evaluations of every rule)."""
    if snapshot.body is None or snapshot.digest is None:  # nothing points at a clearing: a bug if reached
        raise ValueError(f"version {snapshot.version} of the baseline of {snapshot.suite!r} is a clearing: no content")
    with _DECODED_LOCK:
        doc = _DECODED.get(snapshot.digest)
    if doc is None:
        doc = json.loads(zlib.decompress(snapshot.body))
        with _DECODED_LOCK:
            while len(_DECODED) >= _DECODED_MAX:
                _DECODED.pop(next(iter(_DECODED)))
            _DECODED[snapshot.digest] = doc
    return doc


def runs_of(doc: dict[str, Any], metric: str) -> list[RunData]:
    """The snapshot's runs that logged ``metric``, as the stats core reads them (stack ``baseline``)."""
    out = []
    for r in doc["runs"]:
        s = r["series"].get(metric)
        if s is None:
            continue
        steps = np.frombuffer(base64.b64decode(s["steps"]), dtype="<i8").astype(np.int64)
        values = np.frombuffer(base64.b64decode(s["values"]), dtype="<f8").astype(np.float64)
        out.append(RunData(run_id=r["run_id"], seed=r["seed"], repeat=r["repeat"], determinism=r["determinism"],
                           stack=BASELINE_STACK, digests=r["digests"], status=RunStatus.completed.value,
                           series={metric: (steps, values)},
                           dtypes={metric: r["dtypes"][metric]} if metric in r["dtypes"] else {}))
    return out


def baseline_runs(session: Session, baseline: SuiteBaseline, metric: str) -> list[RunData]:
    """The baseline's runs for ``metric``: from its snapshot; a baseline set before snapshots
    existed (no snapshot) is read from the live rows until it is moved."""
    if baseline.snapshot_id is not None:
        snap = session.get(BaselineSnapshot, baseline.snapshot_id)
        if snap is not None:
            return runs_of(document(snap), metric)
    runs = reports.completed_runs(session, baseline.study_id)
    if baseline.stack is not None:
        runs = [r for r in runs if r.stack == baseline.stack]
    return reports.run_data(session, runs, [metric], stack_as=BASELINE_STACK)


def record_snapshot(session: Session, suite: str, study: Study, stack: str | None, caller: Caller,
                    reason: str | None) -> BaselineSnapshot:
    doc = snapshot_document(session, study, stack)
    raw = canonical(doc)
    snap = BaselineSnapshot(suite=suite, version=repository.next_snapshot_version(session, suite), study_id=study.id,
                            stack=stack, digest=hashlib.sha256(raw).hexdigest(), body=zlib.compress(raw, 6),
                            n_runs=len(doc["runs"]), created_by=caller.name, created_by_token_id=caller.token_id,
                            reason=reason)
    session.add(snap)
    session.flush()
    return snap


def snapshot_of(session: Session, baseline: SuiteBaseline) -> BaselineSnapshot | None:
    return session.get(BaselineSnapshot, baseline.snapshot_id) if baseline.snapshot_id is not None else None


def history(session: Session, suite: str, *, limit: int, offset: int) -> tuple[list[BaselineSnapshot], int]:
    rows, total = repository.snapshots_of_suite(session, suite, limit=limit, offset=offset)
    if not total and session.get(SuiteBaseline, suite) is None:
        raise NotFound(f"suite {suite!r} has no baseline")
    return rows, total


def compare(session: Session, suite: str, study_id: int, *, alpha: float = 0.05) -> dict[str, Any]:
    """Each metric of the study (final value, per determinism level and stack) against the suite's
    baseline snapshot: TOST equivalence within the metric's ``margin`` (the study's spec, else the
    baseline's), the report's stack-portability rule with Holm control over the comparisons."""
    baseline = session.get(SuiteBaseline, suite)
    if baseline is None:
        raise NotFound(f"suite {suite!r} has no baseline")
    study = session.get(Study, study_id)
    if study is None:
        raise Invalid(("query", "study_id"), f"study {study_id} does not exist")
    snap = snapshot_of(session, baseline)
    baseline_study = session.get(Study, baseline.study_id)
    base_margins = {m.name: m.margin for m in reports.metric_specs(baseline_study)} if baseline_study else {}
    # bootstraps seeded by what is compared, so the same comparison reads the same every time
    seed = int(snap.digest[:8], 16) if snap is not None and snap.digest else baseline.study_id
    cand_runs = reports.completed_runs(session, study.id)
    verdicts = []
    for spec in reports.metric_specs(study):
        margin = spec.margin if spec.margin is not None else base_margins.get(spec.name)
        base = baseline_runs(session, baseline, spec.name)
        cand = [_relabel(r, f"candidate:{r.stack}") for r in reports.run_data(session, cand_runs, [spec.name])]
        if not base or not cand:
            continue
        with judging(("query", "study_id")):
            cross = build_report([*base, *cand], [MetricSpec(name=spec.name, margin=margin)],
                                 reference_stack=BASELINE_STACK, alpha=alpha,
                                 rng=np.random.default_rng([0x57EAD, seed, study.id]))
        for v in verdicts_of(typed_verdicts(cross), "stack_portability"):
            v.group = PairGroup(determinism=v.group.determinism, reference="baseline", reference_stack=baseline.stack,
                                candidate_stack=v.group.candidate_stack.split(":", 1)[1])
            verdicts.append(v)
    return {"suite": suite, "study_id": study.id, "baseline_study_id": baseline.study_id,
            "baseline_version": snap.version if snap is not None else None,
            "baseline_digest": snap.digest if snap is not None else None, "alpha": alpha, "verdicts": verdicts}


def _relabel(r: RunData, stack: str) -> RunData:
    import dataclasses

    return dataclasses.replace(r, stack=stack)


def set_baseline(session: Session, suite: str, body: BaselineIn, caller: Caller) -> SuiteBaseline:
    study = session.get(Study, body.study_id)
    if study is None:
        raise Invalid(("body", "study_id"), f"study {body.study_id} does not exist")
    studies.ensure_suite_owner(session, suite, caller)
    if study.suite != suite:
        raise Invalid(("body", "study_id"), f"study {study.id} is in suite {study.suite!r}, not {suite!r}")
    if body.stack is not None:
        stacks = repository.study_stacks(session, study.id)
        if body.stack not in stacks:
            raise Invalid(("body", "stack"), f"study {study.id} has no runs on stack {body.stack!r}; it has {sorted(stacks)}")
    row = session.get(SuiteBaseline, suite)
    if row is not None:
        ensure_may_change(caller, row.owner_token_id, f"the baseline of suite {suite!r}")
    _ensure_settled(study)
    # every set is a new frozen version: comparisons read it, never the live rows
    snap = record_snapshot(session, suite, study, body.stack, caller, body.reason)
    if row is None:
        row = SuiteBaseline(suite=suite, study_id=study.id, stack=body.stack, owner_token_id=caller.token_id,
                            snapshot_id=snap.id)
        session.add(row)
    else:
        row.study_id, row.stack, row.set_at, row.snapshot_id = study.id, body.stack, utcnow(), snap.id
    session.flush()
    return row


def baseline_out(session: Session, row: SuiteBaseline) -> BaselineOut:
    out = BaselineOut.model_validate(row, from_attributes=True)
    snap = snapshot_of(session, row)
    if snap is not None:
        out = out.model_copy(update={"version": snap.version, "digest": snap.digest, "n_runs": snap.n_runs,
                                     "set_by": snap.created_by, "reason": snap.reason})
    return out


def _ensure_settled(study: Study) -> None:
    """A baseline is what a study measured: one still queued or running has not measured it yet
    (external studies stay ``open`` and are frozen with the runs uploaded so far)."""
    if study.status in (StudyStatus.queued.value, StudyStatus.running.value):
        raise Conflict(f"study {study.id} is {study.status}: a baseline freezes a settled study's runs; "
                       "set it when the study has ended", loc=("body", "study_id"))


def delete_baseline(session: Session, suite: str, caller: Caller, reason: str | None) -> BaselineSnapshot:
    """Clear the suite's baseline, recorded as a version of its history (action "cleared": who, when,
    why, and the study it was), so comparisons that stop reading a baseline can be traced to the act."""
    row = get_baseline(session, suite)
    ensure_may_change(caller, row.owner_token_id, f"the baseline of suite {suite!r}")
    cleared = BaselineSnapshot(suite=suite, version=repository.next_snapshot_version(session, suite), action="cleared",
                               study_id=row.study_id, stack=row.stack, digest=None, body=None, n_runs=0,
                               created_by=caller.name, created_by_token_id=caller.token_id, reason=reason)
    session.add(cleared)
    session.delete(row)
    session.flush()
    return cleared


def get_baseline(session: Session, suite: str) -> SuiteBaseline:
    row = session.get(SuiteBaseline, suite)
    if row is None:
        raise NotFound(f"suite {suite!r} has no baseline")
    return row
