"""How a run's capture conflicts read, in one wording for ``steady logs``, the run page and the report.

A conflict is a second, different value logged for one (key, step) of a run from stdout or the SDK
(``runs.metric_conflicts``, ``protocol.MetricConflicts``): the first value was kept, the second not stored.
Values an MLflow client logs at one step are a history instead, as MLflow keeps them (``steady.server.mlflow``).
"""

from __future__ import annotations

from typing import Any

from steady.worker.contract.protocol import MAX_CONFLICTS_KEPT

__all__ = ["conflict_lines", "conflict_phrase", "conflict_summary", "merged", "restart_phrase"]


def merged(existing: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two records of a run's conflicts as one (the one stored on the run, e.g. by an earlier version's MLflow
    endpoint, and the worker's, reported with the result): counts added, the first :data:`MAX_CONFLICTS_KEPT` kept in full.
    A conflict recorded already, the same in every part, is a client's retry of one request: not counted again."""
    restart = (existing or {}).get("restart") or (more or {}).get("restart")
    restarts = max(int((existing or {}).get("restarts") or 0), int((more or {}).get("restarts") or 0))
    if not more or not (more.get("count") or more.get("restart")):
        return existing
    if not existing or not (existing.get("count") or existing.get("restart")):
        return more
    count, new = int(more["count"]), list(more.get("first") or [])
    if count == len(new):  # every conflict given in full: the ones seen before can be told apart
        new = [c for c in new if c not in (existing.get("first") or [])]
        count = len(new)
    first = [*(existing.get("first") or []), *new][:MAX_CONFLICTS_KEPT]
    out: dict[str, Any] = {"count": int(existing["count"]) + count, "first": first}
    if restart:
        out.update(restart=restart, restarts=restarts)
    return out


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def conflict_phrase(conflict: dict[str, Any]) -> str:
    """``loss at step 500: kept 2.31 (stdout line 51), not stored 2.295 (stdout line 52)``."""
    kept, dropped = conflict["kept"], conflict["dropped"]
    return (f"{conflict['key']} at step {conflict['step']}: kept {_value(kept['value'])} ({kept['source']}), "
            f"not stored {_value(dropped['value'])} ({dropped['source']})")


def conflict_summary(conflicts: dict[str, Any] | None) -> str | None:
    """One line: how many values were logged twice differently, and for which keys; None when none."""
    if not conflicts or not conflicts.get("count"):
        return None
    count = int(conflicts["count"])
    keys = sorted({c["key"] for c in conflicts.get("first") or []})
    shown = f" ({', '.join(keys)}{', …' if count > len(conflicts.get('first') or []) else ''})" if keys else ""
    noun = "value was" if count == 1 else "values were"
    return (f"{count} {noun} logged a second time, differently, for a step that already had one{shown}: "
            "the first value was kept and the second not stored")


def restart_phrase(restart: dict[str, Any] | None) -> str | None:
    """``the step counter of loss went back at output line 8 (step 29, then 10): …``; None without a restart."""
    if not restart:
        return None
    head = (f"the step counter of {restart['key']} went back at output line {restart['line']:,} (step "
            f"{restart['step_before']:,}, then {restart['step_after']:,}): a restart, e.g. a new epoch printed without "
            "its number; a value at a step already logged was not stored, so the run's final value is the first one "
            "logged at its highest step, not its last printed one")
    pattern = restart.get("pattern")
    return head + (f"; a capture pattern naming the epoch keeps every value: {pattern}" if pattern
                   else "; name the epoch in the capture pattern (a group 'epoch') to keep every value")


def conflict_lines(conflicts: dict[str, Any] | None) -> list[str]:
    """The restart, the summary, then one line per conflict kept in full, then how many more were only counted."""
    restart = restart_phrase((conflicts or {}).get("restart"))
    summary = conflict_summary(conflicts)
    if summary is None or conflicts is None:
        return [f"capture restart: {restart}"] if restart else []
    first = conflicts.get("first") or []
    lines = ([f"capture restart: {restart}"] if restart else []) + [f"capture conflicts: {summary}"]
    lines += [f"  {conflict_phrase(c)}" for c in first]
    more = int(conflicts["count"]) - len(first)
    if more > 0:
        lines.append(f"  … and {more} more (counted, not kept)")
    return lines
