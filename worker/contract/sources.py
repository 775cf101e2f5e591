"""Sources of run-to-run variance, and the per-source seeds a run gets.

A sources study (Summers & Dinneen 2021) varies one source per arm and pins the rest. An arm says which
sources its runs vary with the workload parameter ``sources`` (``"init"``, ``"init,data"``, ``"all"``,
``"none"``); a run's seed for a varied source derives from the run's seed, a pinned source's from a fixed
value, so two runs of one arm differ only by the varied sources. With ``crossed = J`` the run's seed is an
index into an init × data grid: the init seed derives from ``seed // J``, the data seed from ``seed % J``.

User code reads them as ``ctx.seed_for("init")`` (entrypoints) or the placeholders ``{init_seed}``,
``{data_seed}``, ``{dropout_seed}``, ``{numerics_seed}``, ``{ulp_seed}`` (commands). ``ulp`` is not a seed
of a generator but the choice of the one weight whose value moves by one ULP at step 0: when it is not
varied the run perturbs nothing (``seed_for`` gives None, the placeholder ``-1``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

SOURCES = ("init", "data", "dropout", "numerics", "ulp")
SOURCE_LABELS = {
    "init": "initial weights",
    "data": "data order",
    "dropout": "dropout / augmentation",
    "numerics": "kernels / numerics",
    "ulp": "one-ULP change of one weight",
}
SOURCES_PARAM = "sources"
CROSSED_PARAM = "crossed"
SEED_PLACEHOLDERS = tuple(f"{s}_seed" for s in SOURCES)
NO_PERTURBATION = -1


class SourcesError(ValueError):
    """A ``sources`` parameter that names an unknown source."""


def varied_sources(params: Mapping[str, Any]) -> frozenset[str] | None:
    """The sources a run varies, from its ``sources`` parameter; None when the run is not part of a sources
    study (every source then follows the run's seed, ``ulp`` excepted)."""
    raw = params.get(SOURCES_PARAM)
    if raw is None:
        return None
    items = [raw] if isinstance(raw, str) else list(raw)
    names = {p.strip() for item in items for p in str(item).split(",") if p.strip()}
    if names == {"all"}:
        return frozenset(SOURCES)
    if names == {"none"}:
        return frozenset()
    unknown = sorted(names - set(SOURCES))
    if unknown:
        raise SourcesError(f"unknown source(s) {', '.join(unknown)} in parameter {SOURCES_PARAM!r}; known: "
                           f"{', '.join(SOURCES)}, or 'all' / 'none'")
    return frozenset(names)


def _derive(source: str, value: int | str) -> int:
    digest = hashlib.sha256(f"steady-source:{source}:{value}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def seed_for(source: str, *, seed: int, params: Mapping[str, Any]) -> int | None:
    """The run's seed for ``source`` (None: ``ulp`` not varied, nothing to perturb)."""
    if source not in SOURCES:
        raise SourcesError(f"unknown source {source!r}; known: {', '.join(SOURCES)}")
    varied = varied_sources(params)
    if varied is None:
        return None if source == "ulp" else _derive(source, seed)
    if source not in varied:
        return None if source == "ulp" else _derive(source, "pinned")
    crossed = int(params.get(CROSSED_PARAM) or 0)
    if crossed > 0 and source in ("init", "data"):
        return _derive(source, seed // crossed if source == "init" else seed % crossed)
    return _derive(source, seed)


def placeholder_values(*, seed: int, params: Mapping[str, Any]) -> dict[str, int]:
    """``{init_seed}`` … for a command's argv (``{ulp_seed}`` is -1 when the run perturbs nothing)."""
    out = {}
    for s in SOURCES:
        v = seed_for(s, seed=seed, params=params)
        out[f"{s}_seed"] = NO_PERTURBATION if v is None else v
    return out
