from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from steady.server.kit.deps import AppSettings, HeavyReader, ReadDB, UserCaller, WriteDB
from steady.server.kit.pagination import Page, PageQuery
from steady.server.reports import localizations, service
from steady.server.reports.parts import Localization
from steady.server.reports.compare import compare_studies
from steady.server.reports.models import Bands, Compare, Report
from steady.server.kit.responses import NumbersJSONResponse

router = APIRouter(prefix="/api/v1", tags=["reports"])

Probability = Annotated[float, Query(gt=0, lt=1)]


@router.get("/studies/{study_id}/report")
def study_report(caller: HeavyReader, study_id: int, db: ReadDB) -> Report:
    """Verdicts per level, metric and group, with the numbers behind them."""
    return service.study_report(db, study_id)


# Full-resolution bands are millions of numbers, already plain JSON data in the API's spelling of
# non-finite floats: they are rendered as they are (by orjson), not validated and copied again;
# ``Bands`` describes them in the OpenAPI document.
@router.post("/studies/{study_id}/localizations", response_model=Localization)
def record_localization(study_id: int, body: Localization, db: WriteDB, caller: UserCaller) -> Localization:
    """Keep where two repeats of the study parted (what `steady localize` found by replaying them): it
    becomes part of the repeatability verdict of their group. 422 when the runs are not two repeats
    (same seed, determinism and stack) of this study."""
    return localizations.record(db, study_id, body, caller)


@router.get("/studies/{study_id}/localizations", response_model=Page[Localization])
def list_localizations(study_id: int, db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[Localization]:
    """The localizations kept for the study, oldest first (at most the last few pairs are kept)."""
    kept = localizations.localizations(db, study_id)
    return Page.of(kept[page.offset:page.offset + page.limit], len(kept), page)


@router.get("/studies/{study_id}/bands", response_model=Bands)
def study_bands(
    caller: HeavyReader,
    study_id: int,
    db: ReadDB,
    metric: Annotated[str, Query(min_length=1, max_length=200)] = "loss",
    coverage: Probability = 0.9,
    confidence: Probability = 0.95,
    max_points: Annotated[int | None, Query(ge=2, le=1_000_000)] = None,
) -> NumbersJSONResponse:
    """Per-step seed bands of one metric for every (determinism, stack) group."""
    return NumbersJSONResponse(service.study_bands(
        db, study_id, metric=metric, coverage=coverage, confidence=confidence, max_points=max_points
    ))


@router.get("/compare")
def compare(
    caller: HeavyReader,
    db: ReadDB,
    settings: AppSettings,
    baseline: int,
    candidate: int,
    metric: Annotated[str | None, Query(min_length=1, max_length=200,
                                        description="default: every metric both specs name")] = None,
    margin: Annotated[float | None, Query(gt=0, description="absolute equivalence margin (default: the spec's)")] = None,
    relative_margin: Annotated[float | None, Query(gt=0, description="margin as a share of the baseline mean")] = None,
) -> Compare:
    """Stack portability of two studies (e.g. last week's stack against today's), with what differs
    between them (command arguments, params, config, code files, determinism, stack) and what a
    difference in results is attributed to."""
    return compare_studies(
        db, settings, baseline=baseline, candidate=candidate, metric=metric, margin=margin,
        relative_margin=relative_margin,
    )
