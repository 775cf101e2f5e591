"""The one-phrase guarantee of each decision, shown beside the verdict (report, terminal, dashboard).

Each phrase states the false-alarm level the calibration harness (``steady.server.stats.calibration``)
measures the rule against; ``Rule.guarantee`` uses the same phrases at the default levels."""
from __future__ import annotations

from steady.server.stats.resolution import Compared, guarantee_phrase

__all__ = ["repeatability", "seed_stability", "out_of_band", "stack_portability", "sources"]


def _pct(level: float) -> str:
    return f"{level * 100:.3g}%"


def repeatability(compared: Compared | None = None) -> str:
    """Exact, at the resolution the values were compared at (``steady.server.stats.resolution``)."""
    return guarantee_phrase(compared)


def seed_stability(alpha: float = 0.05, *, sequential: bool = False) -> str:
    if sequential:
        return (f"each claim wrong ≤ {_pct(alpha)} over all stages for final values with kurtosis ≤ 9 "
                "(group-sequential, alpha spending; robust σ bounds); diverged seeds exact")
    return f"each claim wrong ≤ {_pct(alpha)} for final values with kurtosis ≤ 9 (robust σ bounds); diverged seeds exact"


def out_of_band(false_alarm: float = 0.01, *, skew_ok: bool = True) -> str:
    head = (f"false alarm ≤ {_pct(false_alarm)} per study while seed effects are no more skewed than lognormal "
            "(log-sd 0.6) and no heavier-tailed than Student-t(3); leave-one-out over the whole curve and its worst "
            "tenth")
    if not skew_ok:
        return head + "; not claimed here: these runs are more skewed than that"
    return head


def stack_portability(alpha: float = 0.05, method: str = "holm", *, sequential: bool = False) -> str:
    if sequential:
        return (f"each claim ('equivalent', 'not equivalent') wrong ≤ {_pct(alpha)} over all stages "
                "(group-sequential TOST, alpha spending; Bonferroni over comparisons); 'equivalent' withheld "
                "for visibly skewed finals with unequal seeds or spreads; " + SMALL_STACKS)
    return (f"false 'equivalent' or 'not equivalent' ≤ {_pct(alpha)} ({'Holm' if method == 'holm' else method.upper()}); "
            "'equivalent' withheld for visibly skewed finals with unequal seeds or spreads; " + SMALL_STACKS)


SMALL_STACKS = ("at 3–5 seeds on a stack a small-sample rule (df of the smaller stack, an allowance for skew) "
                "holds the level for unequal spreads and skewed or outlier finals")


def sources(alpha: float = 0.05, *, sequential: bool = False) -> str:
    """A sources table's TOST of each source's SD against the all-sources SD (per source and metric)."""
    where = " over all stages (group-sequential, alpha spending)" if sequential else ""
    return (f"each claim ('equivalent', 'not equivalent') wrong ≤ {_pct(alpha)} per source and metric{where}; "
            "robust ratio interval (Bonett 2006) for normal, heavy-tailed (t5) and skewed final values")
