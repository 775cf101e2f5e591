"""A sources study's table in the report: where the variance comes from (steady.server.stats.sources)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field

from steady.server.kit.wire import WireFloat
from steady.server.models import Run
from steady.server.reports.parts import Part
from steady.server.stats import sources as st
from steady.server.stats.report_data import RunData, SeedStages
from steady.server.stats.sequential_sources import (SequentialSdRatio, by_stage, sequential_sd_ratio_reason,
                                                     sequential_sd_ratio_tost)
from steady.worker.contract.placeholders import placeholder_names
from steady.worker.contract.sources import SOURCE_LABELS, SOURCES

CROSSED_ARM = "init_x_data"


class SdRatioOut(Part):
    ratio: WireFloat
    lower: WireFloat
    upper: WireFloat
    p_value: WireFloat
    verdict: str = Field(description="equivalent (this source alone gives the full variance, within the margin) | "
                         "not_equivalent | inconclusive")


class SdRatioLookOut(Part):
    stage: int
    n_source: int
    n_all: int
    info_fraction: WireFloat
    boundary: WireFloat = Field(description="c_k on the z scale (inf: this stage could not decide)")
    nominal_alpha: WireFloat = Field(description="each one-sided test's level at this stage: 1 − Φ(c_k)")
    cumulative_alpha: WireFloat
    ratio: WireFloat | None = None
    lower: WireFloat | None = Field(None, description="the (1 − 2·nominal_alpha) robust interval of the SD ratio")
    upper: WireFloat | None = None
    verdict: str


class SourcesSequentialOut(Part):
    verdict: str
    decided_at: int | None = Field(None, description="the stage whose look decided (None: inconclusive)")
    final: bool = Field(description="no further stage: decided, the budget's last stage was judged, or the study "
                        "stopped growing (stopped)")
    spending: str
    max_runs: int = Field(description="the most runs per arm the budget allows")
    last_stage: int
    reason: str
    looks: list[SdRatioLookOut]
    stopped: bool = Field(
        False, description="the study stopped growing before the budget's last stage: its time budget (max_minutes) ran out")


class SourceRowOut(Part):
    source: str
    label: str
    status: str = Field(description="measured | not_varied (the code never reads this source's seed: not a zero) | "
                        "too_few_runs")
    n: int = 0
    sd: WireFloat | None = None
    sd_lower: WireFloat | None = Field(None, description="robust 90% interval of the SD (Bonett 2006)")
    sd_upper: WireFloat | None = None
    vs_all: SdRatioOut | None = Field(None, description="TOST of this source's SD against the all-sources SD")
    runs_needed: int | None = Field(None, description="runs per arm for a conclusive TOST, when inconclusive")
    sequential: SourcesSequentialOut | None = Field(
        None, description="a study with a budget: the group-sequential TOST (alpha spending over the stages) the "
        "verdict stands on; vs_all then shows the look that decided (or the last)")
    note: str = ""


class VarianceComponentOut(Part):
    name: str
    variance: WireFloat
    lower: WireFloat
    upper: WireFloat


class CrossedOut(Part):
    n_init: int
    n_data: int
    confidence: float
    components: list[VarianceComponentOut]


class DivergenceOut(Part):
    steps: list[int]
    ratio: list[WireFloat] = Field(description="RMS difference from the unperturbed twin over √2 × all-sources SD")
    first_half: int | None = Field(None, description="first step where the one-ULP arm is half as far apart as two "
                                   "independent runs")
    first_full: int | None = Field(None, description="first step where it reaches 0.9 of the band")
    final: WireFloat
    n_runs: int = Field(0, description="runs of the one-ULP arm")
    absorbed: int = Field(0, description="of them, runs equal to the unperturbed twin at every step: the change never "
                          "reached this metric (rounding, or a unit that never reaches the loss)")


class SourcesTableOut(Part):
    metric: str
    margin: float
    alpha: float
    all_sources: SourceRowOut | None
    rows: list[SourceRowOut]
    crossed: CrossedOut | None = None
    divergence: DivergenceOut | None = None


def _row(entry_source: str, status: str, row: st.SourceRow | None, note: str = "",
         seq: SequentialSdRatio | None = None, last_stage: int = 1) -> SourceRowOut:
    out: dict[str, Any] = {"source": entry_source, "label": SOURCE_LABELS.get(entry_source, "all sources"),
                           "status": status, "note": note}
    if row is not None:
        out.update(n=row.n, sd=row.sd, sd_lower=row.sd_lower, sd_upper=row.sd_upper, runs_needed=row.runs_needed)
        if row.vs_all is not None:
            v = row.vs_all
            out["vs_all"] = SdRatioOut(ratio=v.ratio, lower=v.lower, upper=v.upper, p_value=v.p_value,
                                       verdict=v.verdict)
    if seq is not None:
        look = seq.deciding
        if look is not None and look.ratio is not None:
            assert look.lower is not None and look.upper is not None and look.p_value is not None
            out["vs_all"] = SdRatioOut(ratio=look.ratio, lower=look.lower, upper=look.upper, p_value=look.p_value,
                                       verdict=seq.verdict)
        if seq.verdict != "inconclusive":
            out["runs_needed"] = None
        out["sequential"] = SourcesSequentialOut(
            verdict=seq.verdict, decided_at=seq.decided_at, final=seq.final, stopped=seq.stopped, spending=seq.spending,
            max_runs=seq.max_runs, last_stage=last_stage, reason=sequential_sd_ratio_reason(seq, last_stage=last_stage),
            looks=[SdRatioLookOut(stage=x.stage, n_source=x.n_source, n_all=x.n_all, info_fraction=x.info_fraction,
                                  boundary=x.boundary, nominal_alpha=x.nominal_alpha,
                                  cumulative_alpha=x.cumulative_alpha, ratio=x.ratio, lower=x.lower, upper=x.upper,
                                  verdict=x.verdict) for x in seq.stages])
    return SourceRowOut(**out)


def exposed_sources(spec: dict[str, Any], runs: Sequence[Run]) -> dict[str, bool]:
    """Which sources the code reads: a command's ``{x_seed}`` placeholders; otherwise what ``ctx.seed_for`` recorded
    (``sources_exposed``, kept with each run)."""
    command = (spec.get("workload") or {}).get("command")
    if command:
        names = {n for arg in command for n in placeholder_names(arg)}
        return {s: f"{s}_seed" in names for s in SOURCES}
    seen = {s for r in runs for s in ((r.determinism_applied or {}).get("sources_exposed") or [])}
    return {s: s in seen for s in SOURCES}


def _final(run: RunData, metric: str) -> float | None:
    series = run.series.get(metric)
    if series is None or len(series[1]) == 0:
        return None
    value = float(series[1][-1])
    return value if np.isfinite(value) else None


def _divergence(by_arm: dict[str, list[RunData]], metric: str) -> st.Divergence | None:
    twins, ulps, alls = by_arm.get("none") or [], by_arm.get("ulp") or [], by_arm.get("all") or []
    if not twins or not ulps or len(alls) < 2 or metric not in twins[0].series:
        return None
    runs = [twins[0], *ulps, *alls]
    if any(metric not in r.series for r in runs):
        return None
    common = twins[0].series[metric][0]
    for r in runs[1:]:
        common = np.intersect1d(common, r.series[metric][0])
    if common.size == 0:
        return None

    def on(r: RunData) -> np.ndarray:
        steps, values = r.series[metric]
        return np.asarray(values, dtype=np.float64)[np.searchsorted(steps, common)]

    return st.ulp_divergence(np.array([on(r) for r in ulps]), on(twins[0]), np.array([on(r) for r in alls]), common)


def _crossed(runs: list[RunData], metric: str, crossed: int) -> np.ndarray | None:
    cells: dict[tuple[int, int], float] = {}
    for r in runs:
        v = _final(r, metric)
        if v is not None:
            cells[(r.seed // crossed, r.seed % crossed)] = v
    rows = sorted({i for i, _ in cells})
    cols = sorted({j for _, j in cells})
    rows = [i for i in rows if all((i, j) in cells for j in cols)]  # complete rows only
    if len(rows) < 2 or len(cols) < 2:
        return None
    return np.array([[cells[(i, j)] for j in cols] for i in rows])


def _sequential(source: str, finals: dict[str, tuple[np.ndarray, np.ndarray]], stages: SeedStages, margin: float,
                alpha: float) -> SequentialSdRatio:
    """The group-sequential TOST of one source against all sources, stage by stage."""
    n = stages.current
    (x, xs), (y, ys) = finals[source], finals["all"]
    return sequential_sd_ratio_tost(by_stage(x, xs, n), by_stage(y, ys, n), max_runs=stages.max_seeds,
                                    last_stage=stages.last_stage, margin=margin, alpha=alpha, spending=stages.spending,
                                    stopped=stages.stopped)


def sources_section(spec: dict[str, Any], runs: Sequence[Run], data: Sequence[RunData],
                    metrics: Sequence[str], stages: SeedStages | None = None) -> list[SourcesTableOut] | None:
    """One table per metric for a sources study (None for any other study). ``stages``: a study with a budget,
    whose arms grow in stages: each source's verdict is then the group-sequential TOST."""
    src = spec.get("sources")
    if not src:
        return None
    margin = float(src.get("margin") or st.SD_MARGIN)
    crossed = src.get("crossed")
    exposed = exposed_sources(spec, runs)
    exposed["all"] = True
    by_arm: dict[str, list[RunData]] = {}
    for r in data:
        by_arm.setdefault(r.stack, []).append(r)
    tables = []
    for metric in metrics:
        finals, staged = {}, {}
        for arm in [*src.get("vary", SOURCES), "all"]:
            pairs = [(v, stages.stage_of_seed.get(r.seed, 1) if stages else 1)
                     for r in by_arm.get(arm, []) if (v := _final(r, metric)) is not None]
            finals[arm] = np.array([v for v, _ in pairs])
            staged[arm] = (finals[arm], np.array([k for _, k in pairs], dtype=np.int64))
        grid = _crossed(by_arm.get(CROSSED_ARM, []), metric, int(crossed)) if crossed else None
        table = st.sources_table(metric, finals, exposed=exposed, crossed_grid=grid,
                                 divergence=_divergence(by_arm, metric) if exposed.get("ulp") else None, margin=margin,
                                 **({} if spec.get("alpha") is None else {"alpha": float(spec["alpha"])}))
        crossed_out = None
        if table.crossed is not None:
            c = table.crossed
            crossed_out = CrossedOut(n_init=c.n_init, n_data=c.n_data, confidence=c.confidence, components=[
                VarianceComponentOut(name=n, variance=v, lower=ci[0], upper=ci[1])
                for n, v, ci in (("init", c.init, c.init_ci), ("data", c.data, c.data_ci),
                                 ("residual", c.residual, c.residual_ci))])
        d = table.divergence
        tables.append(SourcesTableOut(
            metric=metric, margin=margin, alpha=table.alpha,
            all_sources=_row("all", "measured", table.all_sources) if table.all_sources else None,
            rows=[_row(e.source, e.status, e.row, e.note,
                       _sequential(e.source, staged, stages, margin, table.alpha)
                       if stages is not None and e.status == "measured" and table.all_sources is not None else None,
                       stages.last_stage if stages else 1)
                  for e in table.entries],
            crossed=crossed_out,
            divergence=DivergenceOut(steps=list(d.steps), ratio=list(d.ratio), first_half=d.first_half,
                                     first_full=d.first_full, final=d.final, n_runs=d.n_perturbed,
                                     absorbed=d.absorbed) if d else None,
        ))
    return tables
