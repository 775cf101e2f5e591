"""Load a study's runs and series from the database and hand them to the pure stats core."""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import string
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy.orm import Session

from steady.server.kit.db import WriteSession
from steady.server.kit.errors import NotFound, judging
from steady.server.kit.overlap import overlapped
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study, utcnow
from steady.server.reports import localizations, repository
from steady.server.reports.fleet import fleet_section
from steady.server.reports.models import Caveat, Report
from steady.server.reports.outcome import judge
from steady.server.reports.resume import resume_section
from steady.server.reports.sources import exposed_sources, sources_section
from steady.server.runs import repository as runs_repo
from steady.server.runs.conflicts import conflict_phrase, conflict_summary, restart_phrase
from steady.server.stats.convergence import (
    ReferencePoint,
    check_convergence,
    convergence_guarantee,
    reference_from_runs,
    steps_to_target,
)
from steady.server.stats.report_levels import same_seed_phrase
from steady.server.stats.expectations import BUILTIN, SeedRoute
from steady.server.stats.report import (
    GroupBand,
    MetricSpec,
    RunData,
    build_report,
    compute_bands,
    to_data,
)
from steady.server.stats.bands import Band, BandBlocks, block_width
from steady.server.stats.report_data import band_members, check_max_points, decimated, group_band
from steady.server.studies import adaptive
from steady.server.studies import service as studies
from steady.server.studies import repository as studies_repo
from steady.server.studies.arms import arm_differences, differences, effective_arms
from steady.worker.contract.protocol import STEP_TIME_KEYS
from steady.worker.contract.sources import SOURCES, SourcesError, varied_sources


def metric_specs(study: Study) -> list[MetricSpec]:
    return [
        MetricSpec(
            name=m["name"],
            atol=m.get("atol", 0.0),
            rtol=m.get("rtol", 0.0),
            max_std=m.get("max_std"),
            margin=m.get("margin"),
            resolution=m.get("resolution"),
        )
        for m in study.spec.get("metrics", [])
    ]


# per-source seeds a command may read instead of {seed}: each follows the run's seed (in a sources study,
# where its arm varies it); {ulp_seed} is not a seed (-1 unless a ulp arm moves a weight)
_SOURCE_SEEDS = frozenset(f"{s}_seed" for s in SOURCES if s != "ulp")


def seed_route(study: Study, runs: Sequence[Run] = ()) -> SeedRoute:
    """How the study's code receives Steady's seed: an entrypoint gets ``ctx.seed`` at every level, a
    command where an argument holds the ``{seed}`` placeholder or a per-source seed (``{init_seed}`` …),
    an external study's code is the one that labelled its runs with their seeds; a built-in is Steady's
    own code. With the arms of a sources study that pin every per-source seed the code reads
    (``pinned_arms``; ``runs`` tell which an entrypoint reads)."""
    if study.kind == "external":
        return SeedRoute("external", receives_seed=True)
    workload = study.spec.get("workload") or {}
    pinned = pinned_arms(study.spec, runs)
    if workload.get("entrypoint"):
        return SeedRoute("entrypoint", receives_seed=True, pinned=pinned)
    if workload.get("command"):
        fields = {f for arg in workload["command"] for _, f, _, _ in string.Formatter().parse(arg)}
        return SeedRoute("command", receives_seed="seed" in fields or bool(fields & _SOURCE_SEEDS), pinned=pinned)
    return SeedRoute("builtin", pinned=pinned) if pinned else BUILTIN


def pinned_arms(spec: dict[str, Any], runs: Sequence[Run] = ()) -> frozenset[str]:
    """The arms whose runs all get the same value of every per-source seed the code reads: a sources
    study's ``none`` arm, an arm that varies only sources the code never reads (its ``{x_seed}``
    placeholder is absent, or the entrypoint never asked ``ctx.seed_for`` for it), and the ``ulp`` arm
    (``ulp`` is not a seed: its runs share every seed and differ by which weight moves one ULP, a change
    rounding may absorb in every run). Empty when the code reads no per-source seed (its seeds then all
    follow the run's seed)."""
    exposed = {s for s, read in exposed_sources(spec, runs).items() if read}
    if not exposed:
        return frozenset()
    base = (spec.get("workload") or {}).get("params") or {}
    out = set()
    for arm in spec.get("arms") or []:
        try:
            varied = varied_sources({**base, **(arm.get("params") or {})})
        except SourcesError:
            continue
        if varied is not None and not (varied & exposed) - {"ulp"}:
            out.add(arm["name"])
    return frozenset(out)


def completed_runs(session: Session, study_id: int) -> list[Run]:
    """The runs judged: completed and not excluded by a person."""
    return runs_repo.judged_runs(session, study_id)


def excluded_runs(session: Session, study_id: int) -> list[dict[str, Any]]:
    return [{"run_id": r.id, "excluded_at": r.excluded_at.isoformat() if r.excluded_at else None,
             "excluded_by": r.excluded_by,
             "reason": r.excluded_reason} for r in runs_repo.excluded_runs(session, study_id)]


def run_data(session: Session, runs: Sequence[Run], keys: Sequence[str], *, stack_as: str | None = None) -> list[RunData]:
    series = metrics_repo.load_series_shared(session, [r.id for r in runs], list(keys))
    dtypes = metrics_repo.load_dtypes(session, [r.id for r in runs], list(keys))
    printed = metrics_repo.load_resolutions(session, [r.id for r in runs], list(keys))
    out = []
    for r in runs:
        out.append(
            RunData(
                run_id=r.id,
                seed=r.seed,
                repeat=r.repeat,
                determinism=r.determinism,
                stack=stack_as or r.stack,
                fingerprint=r.fingerprint or {},
                digests=r.digests or {},
                status=r.status,
                series={k: series[(r.id, k)] for k in keys if (r.id, k) in series},
                worker=r.worker_id,
                dtypes={k: dtypes[(r.id, k)] for k in keys if (r.id, k) in dtypes},
                resolutions={k: printed[(r.id, k)] for k in keys if (r.id, k) in printed},
                digest_notes=_digest_notes(r),
                restarts=_restarts(r, keys),
            )
        )
    return out


def _restarts(run: Run, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{metric: the output line where its step counter went back} (``MetricRestart``), for the judged keys."""
    restart = (run.metric_conflicts or {}).get("restart")
    return {restart["key"]: dict(restart)} if isinstance(restart, dict) and restart.get("key") in keys else {}


def _digest_notes(run: Run) -> dict[str, str]:
    """Why the run has no digest of a kind, as its code said (``digests_missing`` in its applied record)."""
    notes = (run.determinism_applied or {}).get("digests_missing")
    return {str(k): str(v) for k, v in notes.items() if isinstance(v, str) and v} if isinstance(notes, dict) else {}


def _rng(*parts: int) -> np.random.Generator:
    """Bootstraps are seeded from the study id, so a report reads the same every time."""
    return np.random.default_rng([0x57EAD, *parts])


log = logging.getLogger("steady.reports")


def study_report(session: Session, study_id: int) -> Report:
    """The study's report: from the cache when it was computed for the study's current version
    (and still reads as a ``Report``: a body cached in an older shape is computed again)."""
    study = studies_repo.get_study(session, study_id)
    cached = repository.get(session, study_id)
    if cached is not None and cached.body is not None and cached.version == repository.study_version(session, study):
        try:
            return Report.model_validate_json(zlib.decompress(cached.body))
        except ValidationError as exc:
            log.info("cached report of study %d is in an older shape (%d error(s)): computing it again",
                     study_id, exc.error_count())
    with judging(("path", "study_id")):
        return compute_report(session, study_id)


def refresh_cached_reports(session: Session, *, limit: int = 5) -> list[int]:
    """Compute and store the report of studies that settled or changed since it was cached.

    Run in the background by every API process (see ``steady.server.web.main``); on PostgreSQL a study is
    computed by one process at a time. Returns the studies whose report was stored.
    """
    stored = []
    for study_id in repository.stale_settled_studies(session, limit):
        if not repository.try_lock(session, study_id):
            continue
        study = studies_repo.get_study(session, study_id)
        version = repository.study_version(session, study)
        stamp = utcnow()
        p = studies_repo.progress_by_study(session, [study_id])[study_id]
        body = None
        t0 = time.perf_counter()
        if p.queued == 0 and p.running == 0 and p.completed > 0:
            try:
                body = zlib.compress(compute_report(session, study_id).model_dump_json().encode(), 6)
            except ValueError as exc:  # data the stats core cannot judge: readers get the same 422
                log.warning("report of study %d not cached: %s", study_id, exc)
        seconds = time.perf_counter() - t0
        repository.put(session, study_id, version=version, body=body, computed_at=stamp, compute_seconds=seconds)
        if body is not None:
            log.info("report of study %d cached (%.2f s, %d bytes)", study_id, seconds, len(body))
        stored.append(study_id)
    return stored


class _Bands:
    """The full-resolution bands of the last few reports computed by this process, so the
    dashboard's chart draws the report's band instead of reloading every series and computing it
    again. Keyed by database, study and the study's version (``repository.study_version``)."""

    def __init__(self, size: int = 8) -> None:
        self.size, self._lock = size, threading.Lock()
        self._data: OrderedDict[tuple, tuple[GroupBand, ...]] = OrderedDict()

    def put(self, key: tuple, bands: tuple[GroupBand, ...]) -> None:
        with self._lock:
            self._data[key] = bands
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def get(self, key: tuple) -> tuple[GroupBand, ...] | None:
        with self._lock:
            return self._data.get(key)


_bands = _Bands()


def _bands_key(session: Session, study: Study) -> tuple:
    return str(session.get_bind().engine.url), study.id, repository.study_version(session, study)


def report_band(session: Session, study_id: int, *, metric: str, determinism: str, stack: str) -> GroupBand | None:
    """The band of one (metric, group) from the report this process computed for the study's
    current version (coverage and confidence of the study's spec), or None."""
    study = studies_repo.get_study(session, study_id)
    for b in _bands.get(_bands_key(session, study)) or ():
        if b.metric == metric and b.group == {"determinism": determinism, "stack": stack}:
            return b
    return None


def _report_bands(session: Session, study: Study, *, metric: str, coverage: float, confidence: float,
                  max_points: int | None) -> tuple[GroupBand, ...] | None:
    """The bands of ``metric`` from the report this process computed for the study's current
    version, when they are what was asked (the spec's coverage and confidence, a judged metric);
    else None. Decimated as ``compute_bands`` does."""
    spec = study.spec
    if (coverage != spec.get("coverage", 0.9) or confidence != spec.get("confidence", 0.95)
            or metric not in {m.name for m in metric_specs(study)}):
        return None
    cached = _bands.get(_bands_key(session, study))
    if cached is None:
        return None
    out = tuple(decimated(g, max_points) for g in cached if g.metric == metric)
    return out or None


@dataclasses.dataclass(frozen=True)
class StudyLevel:
    alpha: float = 0.05
    cost_confidence: float | None = None  # None: the CI at the spec's confidence


def study_level(spec: dict[str, Any]) -> StudyLevel:
    """The study's level α (``StudySpec.alpha``) as ``build_report`` takes it: every claim of seed stability and
    stack portability at α, the cost check's CI at 1 − α. Unset: the defaults (0.05; the CI at ``confidence``)."""
    alpha = spec.get("alpha")
    return StudyLevel() if alpha is None else StudyLevel(float(alpha), 1.0 - float(alpha))


def compute_report(session: Session, study_id: int) -> Report:
    study = studies_repo.get_study(session, study_id)
    bands_key = _bands_key(session, study)  # before reading: a change meanwhile makes the key stale, not the data
    specs = metric_specs(study)
    runs = completed_runs(session, study_id)
    spec = study.spec
    keys = [m.name for m in specs] + list(STEP_TIME_KEYS)
    if spec.get("convergence") and spec["convergence"]["metric"] not in keys:
        keys.append(spec["convergence"]["metric"])
    data = run_data(session, runs, keys)
    route = seed_route(study, runs)
    seed_stages = adaptive.seed_stages(session, study)
    level = study_level(spec)
    built = build_report(
        data,
        specs,
        coverage=spec.get("coverage", 0.9),
        confidence=spec.get("confidence", 0.95),
        reference_stack=spec.get("reference_stack"),
        rng=_rng(study_id),
        cost_budget=spec.get("cost_budget"),
        stages=seed_stages,
        route=route,
        alpha=level.alpha,
        cost_confidence=level.cost_confidence,
    )
    convergence = convergence_section(session, data, spec["convergence"]) if spec.get("convergence") else None
    sources = sources_section(spec, runs, data, [m.name for m in specs], stages=seed_stages)
    fleet = fleet_section(spec["fleet"], runs_repo.list_runs(session, study_id, status=None, limit=1_000_000,
                                                             offset=0)[0],
                          data, [m.name for m in specs], {m.name: m.margin for m in specs}) if spec.get("fleet") else None
    del data  # the series: the bands below are all that is kept
    _bands.put(bands_key, built.bands)
    progress = studies_repo.progress_by_study(session, [study_id])[study_id]
    report = Report.assemble(
        built,
        study={"id": study.id, "name": study.name, "status": study.status, "kind": study.kind,
               "suite": study.suite, "progress": progress.model_dump(), "status_reason": study.status_reason,
               "repeats": spec.get("repeats", 1)},
        metrics=[m.__dict__ for m in specs],
        n_runs_judged=len(runs),
        excluded_runs=excluded_runs(session, study_id),
        stages=adaptive.stages_out(session, study),
        arms=arm_differences(spec),
        convergence=convergence,
    )
    _name_arm_differences(report, spec)
    localizations.attach(report, study)
    report.sources = sources
    report.caveats = pinned_caveats(report, route) + capture_caveats(runs)
    report.resume = resume_section(runs, specs[0].name if specs else None)
    report.fleet = fleet
    report.outcome = judge(report)  # with the sources table and the resume checks, which count in the outcome
    return report


def pinned_caveats(report: Report, route: SeedRoute) -> list[Caveat]:
    """One caveat per pinned arm (``pinned_arms``) whose runs of different seeds were bitwise identical, so
    the report judged no seed stability there (``steady.server.stats.report_levels``)."""
    judged = {v.group.stack for v in report.of_level("seed_stability")}
    ran = {v.group.stack for v in report.of_level("repeatability")}
    return [Caveat(kind="pinned_arm", stack=arm, message=_ABSORBED if arm == "ulp" else
                   f"arm {arm}: every seed the code reads is pinned in this arm, and its runs of different "
                   "seeds are bitwise identical, as pinning makes them: they are repeats by design, so seed "
                   "stability is not judged in it (the arms that vary a source judge it)")
            for arm in sorted(route.pinned & (ran - judged))]


_ABSORBED = ("arm ulp: every run moved one weight by one ULP and every run is bitwise identical to the others: each "
             "change was absorbed (rounding swallowed it, or the weight never reaches the loss), so the code does "
             "read {ulp_seed} / seed_for('ulp'), but this arm says nothing about how a change that takes hold grows; "
             "seed stability is not judged in it")


def capture_caveats(runs: Sequence[Run]) -> list[Caveat]:
    """One caveat per judged run whose capture kept a first value over a second, different one."""
    out = []
    for run in runs:
        restart = restart_phrase((run.metric_conflicts or {}).get("restart"))
        if restart is not None:
            out.append(Caveat(kind="capture_conflicts", run_id=run.id,
                              message=f"run {run.id}: {restart} (`steady logs {run.id}`)"))
        summary = conflict_summary(run.metric_conflicts)
        if summary is not None and run.metric_conflicts is not None:
            first = run.metric_conflicts.get("first") or []
            example = f"; e.g. {conflict_phrase(first[0])}" if first else ""
            out.append(Caveat(kind="capture_conflicts", run_id=run.id,
                              message=f"run {run.id}: {summary}{example} (`steady logs {run.id}`)"))
    return out


def _steps_to_target(data: Sequence[RunData], conv: dict[str, Any]) -> list[float]:
    out = []
    for d in data:
        sv = d.series.get(conv["metric"])
        out.append(math.inf if sv is None else
                   steps_to_target(sv[0], sv[1], target=conv["target"], direction=conv["direction"]))
    return out


def _lowest_repeats(data: Sequence[RunData]) -> list[RunData]:
    """One run per (determinism, stack, seed): the lowest repeat (then run id), as the report's levels
    take seeds. Repeats of a seed are not independent draws of its steps to target (bitwise repeats
    are copies), so counting them would shrink the t-test's standard error and inflate its n."""
    best: dict[tuple[str, str, int], RunData] = {}
    for d in data:
        key, cur = (d.determinism, d.stack, d.seed), best.get((d.determinism, d.stack, d.seed))
        if cur is None or (d.repeat, d.run_id) < (cur.repeat, cur.run_id):
            best[key] = d
    return [best[k] for k in sorted(best)]


def _reference_point(session: Session, conv: dict[str, Any]) -> tuple[ReferencePoint | None, dict[str, Any]]:
    """The reference as given (numbers) or formed from another study's completed runs (pooled, one
    per determinism level, stack and seed)."""
    ref = conv["reference"]
    if ref.get("study") is None:
        return ReferencePoint(mean=ref["mean"], std=ref["std"], n=ref["n"]), {"source": "numbers"}
    data = _lowest_repeats(run_data(session, completed_runs(session, ref["study"]), [conv["metric"]]))
    info: dict[str, Any] = {"source": "study", "study": ref["study"], "n_runs": len(data)}
    try:
        return reference_from_runs(_steps_to_target(data, conv), trim=conv.get("trim", 1)), info
    except ValueError as exc:
        return None, {**info, "reason": f"reference study {ref['study']}: {exc}"}


def convergence_section(session: Session, data: Sequence[RunData], conv: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (determinism, stack/arm) group: its runs' steps to target judged against the reference
    (``steady.server.stats.convergence``, MLPerf RCP rules). Completed, non-excluded runs only, one per seed."""
    point, info = _reference_point(session, conv)
    groups: dict[tuple[str, str], list[RunData]] = {}
    for d in _lowest_repeats(data):
        groups.setdefault((d.determinism, d.stack), []).append(d)
    alpha, trim = conv.get("alpha", 0.05), conv.get("trim", 1)
    head = {"metric": conv["metric"], "target": conv["target"], "direction": conv["direction"]}
    out = []
    for (det, stack), rs in sorted(groups.items()):
        group = {"determinism": det, "stack": stack}
        if point is None:
            out.append({**head, "group": group, "reference": info, "verdict": "inconclusive", "reason": info["reason"],
                        "guarantee": convergence_guarantee(alpha), "n_candidate_runs": len(rs)})
            continue
        result = check_convergence(_steps_to_target(rs, conv), point, alpha=alpha, trim=trim)
        reference = {**info, "mean": point.mean, "std": point.std, "n": point.n}
        out.append({**head, "group": group, "reference": reference, **to_data(result)})
    return out


def _name_arm_differences(report: Report, spec: dict[str, Any]) -> None:
    """Each stack-portability verdict names what differs between its two arms (params, config,
    code, stack); the report's ``arms`` lists every arm against the reference."""
    arms = effective_arms(spec)
    for v in report.of_level("stack_portability"):
        ref, cand = arms.get(v.group.reference_stack or ""), arms.get(v.group.candidate_stack)
        if ref is not None and cand is not None:
            v.group.differ_by = differences(ref, cand)
            if any(not d.startswith("stack (") for d in v.group.differ_by):
                _attribute_to_setup(v)


def _attribute_to_setup(v: Any) -> None:
    """Arms that differ by params, config or code: a same-seed difference between them is their own
    doing (source ``setup``), never the kernels' (``numerics``)."""
    pairs = v.same_seed
    if not pairs.n_pairs or pairs.verdict == "identical" or pairs.source == "setup":
        return
    old = same_seed_phrase(pairs)
    v.same_seed = pairs.model_copy(update={"source": "setup"})
    # the phrase sits inside the reason (other clauses, such as which steps were judged, may follow it)
    v.reason = v.reason.replace(old, same_seed_phrase(v.same_seed), 1)


def study_bands(
    session: Session,
    study_id: int,
    *,
    metric: str,
    coverage: float,
    confidence: float,
    max_points: int | None,
) -> dict[str, Any]:
    """The ``Bands`` of ``metric``: JSON-like data whose per-step statistics are numpy arrays
    (``GroupBand.to_arrays``; ``steady.server.kit.responses.NumbersJSONResponse`` writes them with the
    API's spelling of non-finite floats): millions of numbers are rendered as they are, not
    validated into models or turned into Python floats first."""
    study = studies_repo.get_study(session, study_id)
    groups = _report_bands(session, study, metric=metric, coverage=coverage, confidence=confidence,
                           max_points=max_points)
    if groups is None:
        runs = completed_runs(session, study_id)
        with judging(("query", "metric")):
            groups = streamed_bands(session, runs, metric=metric, coverage=coverage, confidence=confidence,
                                    max_points=max_points)
        if groups is None:
            data = run_data(session, runs, [metric])
            if runs and not any(metric in d.series for d in data):
                raise NotFound(f"no completed run of study {study_id} has metric {metric!r}")
            with judging(("query", "metric")):
                groups = compute_bands(data, metric=metric, coverage=coverage, confidence=confidence,
                                       max_points=max_points)
    return {"study_id": study_id, "metric": metric, "coverage": coverage, "confidence": confidence,
            "groups": [g.to_arrays() for g in groups]}


STREAM_THREADS = 2  # judging a block (mostly NumPy's sort, which releases the GIL) costs more than reading it


def streamed_bands(session: Session, runs: Sequence[Run], *, metric: str, coverage: float, confidence: float,
                   max_points: int | None) -> tuple[GroupBand, ...] | None:
    """``compute_bands`` of the runs' ``metric``, each group's matrix read and judged column block by
    column block (``metrics_repo.GridColumns``) instead of loaded whole: a cold ``/bands`` reads
    the data into blocks of a few MB, and judges blocks on ``STREAM_THREADS`` other threads while this
    one reads the next (``overlapped``). A run with a value not finite (diverged, or a logged NaN) is left out of
    its band, which only its whole series tells: the group is then read again without it. Same bands,
    bit for bit. None when a group's runs do not share one gapless step grid, or none is finite: the whole
    load (``run_data``, ``compute_bands``) judges those."""
    check_max_points(max_points)
    logged = metrics_repo.runs_with_key(session, [r.id for r in runs], metric)
    if not logged:
        return None
    out = []
    for members in band_members(run_data(session, runs, []), metric, logged=logged):
        ids = [r.run_id for r in members.runs]
        columns = metrics_repo.grid_columns(session, ids, metric)
        if columns is None:
            return None
        band = _streamed_band(session, columns, coverage=coverage, confidence=confidence)
        diverged = [i in columns.not_finite for i in ids]
        if any(diverged):
            kept = columns.subset([i for i in ids if i not in columns.not_finite])
            if not kept.run_ids:
                return None
            band = _streamed_band(session, kept, coverage=coverage, confidence=confidence, n_runs=len(ids),
                                  excluded=tuple(i for i, d in enumerate(diverged) if d))
        out.append(group_band(members, metric, band, diverged, max_points=max_points))
    return tuple(out)


def _streamed_band(session: Session, columns: metrics_repo.GridColumns, *, coverage: float, confidence: float,
                   n_runs: int | None = None, excluded: tuple = ()) -> Band:
    rows = len(columns.run_ids)
    band = BandBlocks(columns.steps, n_runs=rows if n_runs is None else n_runs, excluded_runs=excluded,
                      coverage=coverage, confidence=confidence)
    spare: queue.SimpleQueue = queue.SimpleQueue()  # blocks judged, filled again by the reader

    def judge(blocks) -> None:
        for c0, block in blocks:
            band.add(c0, block, owned=True)
            spare.put(block)

    overlapped(columns.blocks(session, block_width(rows), spare=spare), judge, consumers=STREAM_THREADS)
    return band.band()


def run_settled(session: WriteSession, study_id: int) -> None:
    """A run of the study settled (:mod:`steady.server.runs.settled`): derive the study's status again, judging
    a settled stage of an adaptive study with its report."""
    studies.refresh_status(session, study_id, report_of=compute_report)
