"""The calibration table: every registered rule × scenario, measured, formatted as text, markdown
and JSON. ``steady calibrate`` and ``bench/calibration_bench.py`` call ``run_table``; the docs'
table (results/calibration.md) is written by ``update_doc`` between two marker lines."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from steady.server.stats.calibration import Rate, Rule, clopper_pearson, exceeds_nominal, measure

__all__ = ["run_table", "format_text", "format_markdown", "to_json", "update_doc", "power_offsets",
           "format_power_markdown", "late_blowup_rows", "format_blowup_markdown", "block_markers", "KINDS",
           "DOC_START", "DOC_END", "POWER_START", "POWER_END", "BLOWUP_START", "BLOWUP_END", "shift_power_rows",
           "format_shift_power_markdown", "SHIFT_POWER_START", "SHIFT_POWER_END", "where_users_are", "run_rows",
           "WHERE_USERS_ARE"]

KINDS = ("healthy", "stress", "planted")
DOC_START = "<!-- calibration-table:start -->"
DOC_END = "<!-- calibration-table:end -->"
POWER_START = "<!-- power-table:start -->"
POWER_END = "<!-- power-table:end -->"
BLOWUP_START = "<!-- blowup-power-table:start -->"
BLOWUP_END = "<!-- blowup-power-table:end -->"
SHIFT_POWER_START = "<!-- shift-power-table:start -->"
SHIFT_POWER_END = "<!-- shift-power-table:end -->"


def block_markers(name: str) -> tuple[str, str]:
    """The marker lines of a named table block (``steady calibrate --doc-block NAME``): a table of some
    rules only, regenerated without touching the full table."""
    return f"<!-- calibration-table:{name}:start -->", f"<!-- calibration-table:{name}:end -->"


def run_table(rules: Sequence[Rule], *, sims: int, rng: np.random.Generator, kinds: Sequence[str] = KINDS,
              planted_sims: int | None = None,
              progress: Callable[[Rate], None] | None = None) -> list[tuple[Rule, str, Rate]]:
    """Measure every scenario of every rule whose kind is in ``kinds``: ``sims`` trials each
    (``planted_sims`` for planted scenarios, default ``sims``). Returns (rule, description, rate)."""
    if sims < 1:
        raise ValueError(f"sims must be >= 1, got {sims}")
    out = []
    for rule in rules:
        for sc in rule.scenarios:
            if sc.kind not in kinds:
                continue
            n = planted_sims if (sc.kind == "planted" and planted_sims) else sims
            rate = measure(rule, sc, n=n, rng=rng)
            out.append((rule, sc.description, rate))
            if progress is not None:
                progress(rate)
    return out


WHERE_USERS_ARE = "where-users-are"  # the doc block of the rows below (results/calibration.md)
_WHERE_USERS_ARE_PREFIXES = ("quantized-", "small-", "heavy-t3-offsets-", "heavy-lognormal0.6-offsets-")
WANDERING = "wandering"  # the doc block of the suite-shift rows on slowly wandering environments
_WANDERING_PREFIXES = ("lifetime_100_effect_ar", "lifetime_100_ar0.7")


def where_users_are(rules: Sequence[Rule]) -> list[tuple[Rule, object]]:
    """The (rule, scenario) rows of results/calibration.md's "Where users are" block: quantized metrics, small
    unequal stacks, heavy-tailed seed effects."""
    return [(r, sc) for r in rules for sc in r.scenarios if sc.name.startswith(_WHERE_USERS_ARE_PREFIXES)]


def wandering(rules: Sequence[Rule]) -> list[tuple[Rule, object]]:
    """The (rule, scenario) rows of results/calibration.md's "Slowly wandering environments" block: how often
    the suite-shift alert fires, and fires with no caveat beside it."""
    return [(r, sc) for r in rules for sc in r.scenarios if sc.name.startswith(_WANDERING_PREFIXES)]


def run_rows(pairs, *, sims: int, rng: np.random.Generator) -> list[tuple[Rule, str, Rate]]:
    """``run_table`` for chosen (rule, scenario) pairs: ``sims`` trials each, in order."""
    return [(rule, sc.description, measure(rule, sc, n=sims, rng=rng)) for rule, sc in pairs]


def _status(rate: Rate) -> str:
    if rate.kind == "healthy":
        return "ABOVE NOMINAL" if exceeds_nominal(rate) else "ok"
    if rate.kind == "stress":
        return "outside the guarantee" if rate.rate > rate.nominal else "ok"
    return "power"


def format_text(rows) -> str:
    """A fixed-width table: rule, scenario, kind, rate, 95% CI, nominal, status."""
    head = f"{'rule':34} {'scenario':32} {'kind':8} {'rate':>7} {'95% CI':>17} {'nominal':>8}  status"
    lines = [head, "-" * len(head)]
    for _, _, r in rows:
        lines.append(f"{r.rule:34} {r.scenario:32} {r.kind:8} {r.rate:7.3f} "
                     f"[{r.low:6.3f}, {r.high:6.3f}] {r.nominal:8.3g}  {_status(r)}")
    return "\n".join(lines)


def format_markdown(rows) -> str:
    """The docs' table: one row per rule × scenario, with k/n and the exact 95% CI."""
    out = ["| rule | scenario | kind | what is simulated | fired k/n | rate | 95% CI | nominal | guarantee |",
           "|---|---|---|---|---|---|---|---|---|"]
    for rule, desc, r in rows:
        out.append(f"| `{r.rule}` | `{r.scenario}` | {r.kind} | {_cell(desc)} | {r.k}/{r.n} | {r.rate:.3f} | "
                   f"{r.low:.3f}–{r.high:.3f} | {r.nominal:g} | {_cell(rule.guarantee)} |")
    return "\n".join(out)


def _cell(text: str) -> str:
    """``text`` inside one table cell: a pipe (``|Δ|``) would end the cell, so it is escaped."""
    return text.replace("|", "\\|")


def to_json(rows, **meta) -> dict:
    return {**meta, "rates": [{"rule": r.rule, "scenario": r.scenario, "kind": r.kind, "description": d,
                               "k": r.k, "n": r.n, "rate": r.rate, "ci_low": r.low, "ci_high": r.high,
                               "nominal": r.nominal, "guarantee": rule.guarantee,
                               "above_nominal": bool(r.kind == "healthy" and exceeds_nominal(r))}
                              for rule, d, r in rows]}


def update_doc(text: str, table: str, *, start: str = DOC_START, end: str = DOC_END) -> str:
    """``text`` with everything between the ``start`` and ``end`` marker lines replaced by ``table``."""
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if i < 0 or j < 0:
        raise ValueError(f"the document has no {start} … {end} block")
    return f"{text[:i]}{start}\n{table}\n{end}{text[j + len(end):]}"


def format_power_markdown(power: list[dict]) -> str:
    out = ["| seeds | offset for 80% power (× level sd, normal theory) | before: Bonferroni-t | "
           "measured power at that offset | 95% CI | sims |",
           "|---|---|---|---|---|---|"]
    for p in power:
        out.append(f"| {p['seeds']} | {p['offset_level_sd']:.2f} | {p['offset_bonferroni']:.2f} | {p['power']:.3f} | "
                   f"{p['ci_low']:.3f}–{p['ci_high']:.3f} | {p['n']} |")
    return "\n".join(out)


def late_blowup_rows(*, rng: np.random.Generator, sims: int, seeds=(5, 10, 20), n_steps: int = 300) -> list[dict]:
    """Power against a late blow-up (×40 over the last 10% of the steps) of one seed and of three
    (among 10 or 20), with every blown-up run named: ``rules_seeds.late_blowup_power``."""
    from steady.server.stats.calibration.rules_seeds import late_blowup_power

    out = []
    for n_bad, ns in ((1, seeds), (3, tuple(n for n in seeds if n >= 10))):
        for n in ns:
            k = late_blowup_power(rng, n_seeds=n, sims=sims, n_bad=n_bad, n_steps=n_steps)
            lo, hi = clopper_pearson(k, sims)
            out.append({"seeds": n, "blown_up": n_bad, "k": k, "n": sims, "power": k / sims, "ci_low": lo,
                        "ci_high": hi})
    return out


def format_blowup_markdown(rows: list[dict]) -> str:
    out = ["| seeds | runs blown up (×40, last 10%) | flagged and named | 95% CI | sims |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['seeds']} | {r['blown_up']} | {r['power']:.3f} | {r['ci_low']:.3f}–{r['ci_high']:.3f} | "
                   f"{r['n']} |")
    return "\n".join(out)


def shift_power_rows(*, rng: np.random.Generator, sims: int) -> list[dict]:
    """Power of the suite-shift alert against planted shifts (``rules_alerts.SHIFT_POWER_SETTINGS``), now
    and with studies scored as independent (the rule before dependence was estimated), same histories."""
    from steady.server.stats.calibration.rules_alerts import SHIFT_POWER_SETTINGS, shift_power

    out = []
    for name, what, n, start, shift, ar in SHIFT_POWER_SETTINGS:
        now, before = shift_power(rng, sims=sims, n=n, shift_from=start, shift=shift, ar=ar)
        lo, hi = clopper_pearson(now, sims)
        out.append({"scenario": name, "description": what, "n": sims, "now": now / sims, "before": before / sims,
                    "ci_low": lo, "ci_high": hi})
    return out


def format_shift_power_markdown(rows: list[dict]) -> str:
    out = ["| planted | what | before: scored as independent | now: prewhitened | 95% CI (now) | sims |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{r['scenario']}` | {r['description']} | {r['before']:.3f} | {r['now']:.3f} | "
                   f"{r['ci_low']:.3f}–{r['ci_high']:.3f} | {r['n']} |")
    return "\n".join(out)


def power_offsets(*, rng: np.random.Generator, sims: int, seeds=(5, 10, 20), n_steps: int = 300,
                  rho: float = 0.9) -> list[dict]:
    """For each number of seeds: the whole-curve offset (× the level sd) flagged with 80% power by
    normal theory, and the power measured at that offset on AR(1) curves with seed offsets."""
    from steady.server.stats.calibration.rules_seeds import (
        bonferroni_offset_for_power,
        curve_level_sd,
        offset_for_power,
        oob_planted_power,
    )

    out = []
    for n in seeds:
        d = offset_for_power(n)
        k = oob_planted_power(rng, n_seeds=n, delta=d, sims=sims, n_steps=n_steps, rho=rho)
        lo, hi = clopper_pearson(k, sims)
        out.append({"seeds": n, "offset_level_sd": d, "offset_bonferroni": bonferroni_offset_for_power(n),
                    "level_sd": curve_level_sd(n_steps, rho=rho),
                    "n_steps": n_steps, "rho": rho, "k": k, "n": sims, "power": k / sims, "ci_low": lo, "ci_high": hi})
    return out
