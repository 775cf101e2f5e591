"""``GET /api/v1/compare``: two studies' final metrics judged as two stacks, next to what really
differs between the studies (``steady.server.reports.differences``) and what a difference in results
is attributed to.

The metrics judged default to those the studies' specs name, each with the spec's margin and
tolerances; a difference in results is the studies' own doing when their setup differs (an argument,
a parameter, a file of the code…), the stack's when only the stack differs, and only otherwise the
kernels' (``numerics``).
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

import steady.worker.contract.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module, not the package
from steady.server.code import service as code_service
from steady.server.kit.config import Settings
from steady.server.kit.errors import Invalid, NotFound, judging
from steady.server.models import Run, Study
from steady.server.reports.differences import (
    SPEC_MAX_BYTES,
    STACK,
    CodeFiles,
    Difference,
    StudySide,
    differences,
    is_spec_text,
)
from steady.server.reports.models import Compare, PortabilityVerdict, typed_verdicts, verdicts_of, worst
from steady.server.reports.service import completed_runs, run_data, study_level
from steady.server.stats.report import MetricSpec, build_report
from steady.server.stats.report_levels import same_seed_phrase
from steady.server.stats.repeatability import size_phrase
from steady.server.studies import repository as studies_repo

__all__ = ["compare_studies"]

SETUP = "setup"  # the source of a difference when the studies set up their runs differently


def _rng(*parts: int) -> np.random.Generator:
    return np.random.default_rng([0x57EAD, *parts])


class CodeFilesCache:
    """What compare needs from each archive (its files' digests, which files are specs), computed once per
    archive and kept as those small results, never file bytes; least recently used first out past
    ``budget`` bytes (an estimate: each file's name, its hex digest and the objects around them). An archive
    never changes under its digest, so an entry never goes stale. Two compares of one archive not yet
    known wait for one computation."""

    PER_FILE_OVERHEAD = 200

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[str, tuple[CodeFiles, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[str, threading.Lock] = {}

    @classmethod
    def cost(cls, files: CodeFiles) -> int:
        return 512 + sum(len(n) + len(d) + cls.PER_FILE_OVERHEAD for n, d in (files.files or {}).items())

    def get(self, sha256: str, compute: Callable[[], CodeFiles]) -> CodeFiles:
        with self._lock:
            found = self._hit(sha256)
            if found is not None:
                return found
            gate = self._computing.setdefault(sha256, threading.Lock())
        with gate:
            with self._lock:
                found = self._hit(sha256)
            if found is not None:
                return found
            files = compute()
            with self._lock:
                self._computing.pop(sha256, None)
                if files.problem is None:  # a missing archive may be uploaded again: not kept
                    self._put(sha256, files)
            return files

    def _hit(self, sha256: str) -> CodeFiles | None:
        entry = self._entries.get(sha256)
        if entry is None:
            return None
        self._entries.move_to_end(sha256)
        return entry[0]

    def _put(self, sha256: str, files: CodeFiles) -> None:
        cost = self.cost(files)
        if cost > self.budget:
            return
        while self._entries and self.used + cost > self.budget:
            _, (_, freed) = self._entries.popitem(last=False)
            self.used -= freed
        self._entries[sha256] = (files, cost)
        self.used += cost

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.used = 0


CODE_FILES_BUDGET = 64 * 1024 * 1024
code_files_cache = CodeFilesCache(CODE_FILES_BUDGET)


def read_code_files(session: Session, sha256: str, settings: Settings) -> CodeFiles:
    """An archive's files and spec files, read from the stored archive (no cache)."""
    try:
        digests, small = code_service.file_digests(session, sha256, settings, keep_max=SPEC_MAX_BYTES)
    except (NotFound, codepack.CodeError) as exc:
        return CodeFiles(sha256, problem=str(exc))
    return CodeFiles(sha256, digests, frozenset(n for n, data in small.items() if is_spec_text(n, data)))


def _code_files(session: Session, sha256: str | None, settings: Settings) -> CodeFiles | None:
    if not sha256:
        return None
    return code_files_cache.get(sha256, lambda: read_code_files(session, sha256, settings))


def _arm_code(session: Session, spec: dict[str, Any], settings: Settings) -> dict[str, CodeFiles]:
    out = {}
    for arm in spec.get("arms") or []:
        code = arm.get("code")
        sha = code.get("sha256") if isinstance(code, dict) else None
        files = _code_files(session, sha, settings)
        if files is not None:
            out[arm["name"]] = files
    return out


def _side(session: Session, study: Study, runs: Sequence[Run], settings: Settings) -> StudySide:
    return StudySide(spec=study.spec, fingerprints=[r.fingerprint or {} for r in runs],
                     code=_code_files(session, study.code_sha256, settings),
                     arm_code=_arm_code(session, study.spec, settings))


def _spec_metrics(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in spec.get("metrics") or [] if isinstance(m, dict) and "name" in m}


def _metric_names(base: dict[str, Any], cand: dict[str, Any], metric: str | None) -> list[str]:
    """The metric asked for; else those both specs name (in the baseline's order); else the baseline's."""
    if metric is not None:
        return [metric]
    a, b = _spec_metrics(base), _spec_metrics(cand)
    return [n for n in a if n in b] or list(a) or list(b) or ["loss"]


def _metric_specs(base: dict[str, Any], cand: dict[str, Any], names: list[str], *, margin: float | None,
                  relative_margin: float | None, base_runs: list) -> list[tuple[MetricSpec, str]]:
    """Each metric with the margin and tolerances the baseline's spec states (else the candidate's),
    a margin given in the query winning; with where the margin came from."""
    a, b = _spec_metrics(base), _spec_metrics(cand)
    out = []
    for name in names:
        stated = a.get(name) or b.get(name) or {}
        m, origin = stated.get("margin"), "spec" if stated.get("margin") is not None else "none"
        if margin is not None:
            m, origin = margin, "query"
        elif relative_margin is not None:
            finals = [d.series[name][1][-1] for d in base_runs if name in d.series and len(d.series[name][1])]
            finite = [f for f in finals if np.isfinite(f)]
            if not finite:
                raise Invalid(("query", "relative_margin"), f"the baseline has no finite final {name!r} to scale by")
            m, origin = abs(float(np.mean(finite))) * relative_margin, "relative_margin"
        out.append((MetricSpec(name=name, atol=float(stated.get("atol") or 0.0), rtol=float(stated.get("rtol") or 0.0),
                               margin=m), origin))
    return out


def _alpha(base: dict[str, Any], cand: dict[str, Any]) -> float:
    """The level of the comparison's claims: the spec's ``alpha`` as the study report reads it
    (``service.study_level``), the baseline's, else the candidate's, else 0.05."""
    return study_level(base if base.get("alpha") is not None else cand).alpha


def _attribution(diffs: list[Difference]) -> tuple[str | None, str]:
    """(the source a difference in results is attributed to, None: as the runs' digests say; the sentence)."""
    setup = [d for d in diffs if d.kind not in (STACK, "spec_file")]  # a spec file's settings are listed as such
    stack = [d for d in diffs if d.kind == STACK]
    if setup:
        named = "; ".join(d.note for d in setup[:3]) + (f"; and {len(setup) - 3} more" if len(setup) > 3 else "")
        return SETUP, (f"the studies differ in what their runs do ({named}): a difference in results is attributed "
                       "to that, not to numerics")
    if stack:
        fields = ", ".join(d.name for d in stack[:6]) + (f" and {len(stack) - 6} more" if len(stack) > 6 else "")
        return STACK, f"only the stack differs ({fields}): a difference in results is attributed to it"
    return None, ("the studies set up their runs the same way on the same stack: a difference in results is "
                  "numerics (kernels, reduction order, threads) or chance")


def _same_seed_note(v: PortabilityVerdict, source: str | None, diffs: list[Difference]) -> str:
    p = v.same_seed
    if p.n_pairs == 0:
        return ""
    if p.verdict == "identical":
        return f"; same seed in both studies: bitwise identical ({p.n_pairs} seed(s))"
    size = (size_phrase(p.max_abs_delta, p.max_ulps, p.resolution) if p.resolution is not None
            else f"max |Δ| {p.max_abs_delta:.3g} ({p.max_ulps} ULPs in the logged type)")
    if source == SETUP:
        cause = "as the studies' setup differs"
    elif source == STACK:
        cause = "source: stack (" + ", ".join(d.name for d in diffs if d.kind == STACK)[:200] + ")"
    else:
        cause = f"source: {p.source}"
    return (f"; same seed in both studies: first divergence at step {p.first_divergent_step}, {size}, {cause}")


def _restate(v: PortabilityVerdict, source: str | None, diffs: list[Difference]) -> PortabilityVerdict:
    """The verdict as two studies read: "in both studies" (not "on both stacks"), and the same-seed
    difference attributed to what the studies differ by."""
    stats_phrase = same_seed_phrase(v.same_seed)
    # the stats core's phrase sits inside the reason (other clauses, such as which steps were judged, may follow it)
    reason = v.reason.replace(stats_phrase, "", 1) if stats_phrase else v.reason
    pairs = v.same_seed
    if source is not None and pairs.n_pairs and pairs.verdict != "identical":
        pairs = pairs.model_copy(update={"source": source})
    v = v.model_copy(update={"same_seed": pairs})
    return v.model_copy(update={"reason": reason + _same_seed_note(v, source, diffs)})


def compare_studies(
    session: Session,
    settings: Settings,
    *,
    baseline: int,
    candidate: int,
    metric: str | None,
    margin: float | None,
    relative_margin: float | None,
) -> Compare:
    """Stack portability between two studies on the final value of each run's series.

    Both studies' runs are relabelled as two stacks, ``baseline`` and ``candidate``, and judged by
    the same rule as the study report's stack-portability verdicts, per determinism level present in
    both, for each metric (default: those the specs name, with their margins), at the level the specs state
    (``alpha``, as the study report reads it: the baseline's, else the candidate's, else 0.05).
    """
    if margin is not None and relative_margin is not None:
        raise Invalid(("query", "relative_margin"), "give either margin or relative_margin, not both")
    if baseline == candidate:
        raise Invalid(("query", "candidate"), "baseline and candidate are the same study")
    base_study, cand_study = studies_repo.get_study(session, baseline), studies_repo.get_study(session, candidate)
    names = _metric_names(base_study.spec, cand_study.spec, metric)
    base_rows, cand_rows = completed_runs(session, baseline), completed_runs(session, candidate)
    base_runs = run_data(session, base_rows, names, stack_as="baseline")
    cand_runs = run_data(session, cand_rows, names, stack_as="candidate")
    specs = _metric_specs(base_study.spec, cand_study.spec, names, margin=margin, relative_margin=relative_margin,
                          base_runs=base_runs)
    with judging(("query", "metric")):
        report = build_report(
            [*base_runs, *cand_runs],
            [s for s, _ in specs],
            reference_stack="baseline",
            rng=_rng(baseline, candidate, zlib.crc32(",".join(names).encode())),
            alpha=_alpha(base_study.spec, cand_study.spec),
        )
    diffs = differences(_side(session, base_study, base_rows, settings), _side(session, cand_study, cand_rows, settings))
    source, attribution = _attribution(diffs)
    verdicts = [_restate(v, source, diffs) for v in verdicts_of(typed_verdicts(report), "stack_portability")]
    first = specs[0][0]
    return Compare.model_validate({
        "baseline": {"id": base_study.id, "name": base_study.name, "n_runs": len(base_runs)},
        "candidate": {"id": cand_study.id, "name": cand_study.name, "n_runs": len(cand_runs)},
        "metric": first.name,
        "margin": first.margin,
        "metrics": [{"name": s.name, "margin": s.margin, "margin_from": origin, "atol": s.atol, "rtol": s.rtol}
                    for s, origin in specs],
        "verdicts": verdicts,
        "verdict": worst([v.verdict for v in verdicts]),
        "code": _code_comparison(base_study, cand_study, diffs),
        "differences": [{"kind": d.kind, "name": d.name, "baseline": d.baseline, "candidate": d.candidate,
                         "note": d.note} for d in diffs],
        "attribution": attribution,
    })


def _code_comparison(base: Study, cand: Study, diffs: list[Difference]) -> dict[str, Any]:
    """The two archives, and which files of the code changed (a spec file is not code)."""
    a, b = base.code_sha256, cand.code_sha256
    code = [d for d in diffs if d.kind == "code"]
    whole = [d for d in code if d.name.startswith("archive")]  # one side has no code, or files unreadable
    files = [d.name for d in code if d not in whole]
    specs = [d.name for d in diffs if d.kind == "spec_file"]
    if a == b:
        note = "same code" if a else "no code (built-in workloads)"
    elif whole:
        note = whole[0].note
    elif files:
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        note = f"code differs in {len(files)} file(s): {shown}"
    else:
        note = "same code files" + (f"; only the spec file changed ({', '.join(specs)})" if specs else "")
    return {"baseline": a, "candidate": b, "differs": bool(code), "changed_files": files, "spec_files": specs,
            "note": note}
