"""Machine load and process CPU time from /proc: standard library only, so that the MLflow
reference (run by MLflow's own interpreter, without Steady's dependencies) uses it too."""

from __future__ import annotations

import os


def load() -> dict:
    """The machine's load right now: 1/5/15-minute load averages and the CPU count."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1m": round(one, 2), "loadavg_5m": round(five, 2), "loadavg_15m": round(fifteen, 2),
            "cpus": os.cpu_count()}


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by a process and all its live descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
        todo.extend(child for child, (ppid, _) in stats.items() if ppid == p)
    return total
