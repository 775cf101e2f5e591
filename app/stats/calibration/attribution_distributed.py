"""Calibration of the distributed source: how often ``distributed`` is named when the distributed layer is the
cause, and how often when it is not.

The rule (``steady.server.stats.distributed``, in ``steady.server.stats.repeatability``): after ``stack``,
``seeding`` and ``data_order``, a pair of multi-process repeats is attributed to ``distributed`` when a rank
of a run disagrees with rank 0 on its layer order or named state (per-rank state), or when, at the first
optimizer step where the runs' per-rank gradient digests differ, the gradients every rank computed are the
same and the all-reduced ones are not (reduction); otherwise to ``numerics``. The reduction finding is
ordered in time: when the kernels changed what a rank computed at or before the step where the reduction
changed, the first cause is the kernels, and ``numerics`` is right.

``DISTRIBUTED_ATTRIBUTION`` simulates pairs of 3- or 4-rank runs (float32 loss curves with AR(1) noise, as in
``attribution.simulate_pair``, with the per-rank records a run reports) with the planted sources of each
scenario at random steps and sizes. Healthy scenarios fire when ``distributed`` is named although the layer
changed nothing (nothing planted; kernels alone; kernels that act before a reduction change); planted ones
fire when the expected source is named.

Pure: numpy and ``steady.server.stats`` only.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from steady.server.stats.calibration import Rule, Scenario
from steady.server.stats.calibration.attribution import simulate_pair
from steady.server.stats.repeatability import RepeatRun, repeatability

__all__ = ["LAYER", "simulate_distributed_pair", "DISTRIBUTED_ATTRIBUTION"]

LAYER = ("reduction", "per_rank")  # the distributed plants; the others are attribution.PRECEDENCE's
MODEL = ["inp.weight", "inp.bias", *(f"{n}.{p}" for n in ("alpha", "beta", "gamma", "delta") for p in ("weight", "bias")),
         "head.weight", "head.bias"]


def _record(world: int, steps: int, *, local_from: int | None = None, reduced_from: int | None = None,
            tag: str = "", swapped_rank: int | None = None) -> dict[str, Any]:
    ranks = []
    for k in range(world):
        rows = []
        for s in range(steps):
            local = f"l{s}.{k}" + (tag if local_from is not None and s >= local_from else "")
            reduced = f"r{s}" + (tag if reduced_from is not None and s >= reduced_from else "")
            rows.append([local, reduced])
        model = list(MODEL)
        named = "n"
        if swapped_rank == k:  # this rank built its hidden layers in another order
            model = MODEL[:2] + MODEL[4:6] + MODEL[2:4] + MODEL[6:]
            named = "n-swapped"
        ranks.append({"rank": k, "rc": 0, "fingerprint": "fp", "initial_weights": "i", "final_weights": "f",
                      "named_state": named, "named_final": named, "model": model, "steps": rows})
    return {"world_size": world, "backend": "gloo", "ranks": ranks}


def _perturb(values: np.ndarray, start: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(values.size)
    size = 10 ** rng.uniform(-9, -5)
    out = values.copy()
    out[start:] = values[start:] * (1 + size * np.exp((t[start:] - start) / 10.0))
    return out.astype(np.float32).astype(np.float64)


def simulate_distributed_pair(planted: Iterable[str], rng: np.random.Generator, *, steps: int = 60
                              ) -> tuple[tuple[RepeatRun, RepeatRun], str | None]:
    """Two repeats of a simulated 3- or 4-rank run that differ by the ``planted`` sources (any of
    ``stack``, ``seeding``, ``data_order``, ``numerics``, ``reduction``, ``per_rank``), and the source the
    report must name. ``numerics`` changes what the ranks compute from a random step (local and reduced
    digests, the values by a random relative size in [1e-9, 1e-5] that grows); ``reduction`` changes the
    all-reduced gradients from a random step and what the ranks compute from the next one; ``per_rank``
    gives one rank of each run (a random one) another layer order, and the values differ from the start."""
    planted = set(planted)
    upstream = planted & {"stack", "seeding", "data_order"}
    a, b = simulate_pair(upstream, rng, steps=steps)
    world = int(rng.choice([3, 4]))
    values = b.values
    kn = int(rng.integers(0, steps)) if "numerics" in planted else None
    kr = int(rng.integers(0, steps)) if "reduction" in planted else None
    starts = [k for k in (kn, kr) if k is not None]
    local_from = min([k for k in (kn, None if kr is None else kr + 1) if k is not None], default=None)
    reduced_from = min(starts, default=None)
    if starts:
        values = _perturb(values, min(starts), rng)
    swapped_a = swapped_b = None
    if "per_rank" in planted:
        swapped_a, swapped_b = int(rng.integers(1, world)), int(rng.integers(1, world))
        values = _perturb(values * (1 + 1e-3), 0, rng)
    rec_a = _record(world, steps, swapped_rank=swapped_a)
    rec_b = _record(world, steps, local_from=local_from, reduced_from=reduced_from, tag="'", swapped_rank=swapped_b)
    fp = dict(a.fingerprint or {}, distributed={"world_size": world})
    fp_b = dict(b.fingerprint or {}, distributed={"world_size": world})
    # the weights part bitwise wherever the layer or the kernels acted, even when the logged loss rounds alike
    moved = bool(starts) or "per_rank" in planted
    run_a = RepeatRun(steps=a.steps, values=a.values, fingerprint=fp, initial_weights=a.initial_weights,
                      data_order=a.data_order, distributed=rec_a, other_digests={"final_weights": "fa"})
    run_b = RepeatRun(steps=b.steps, values=values, fingerprint=fp_b, initial_weights=b.initial_weights,
                      data_order=b.data_order, distributed=rec_b,
                      other_digests={"final_weights": "fb" if moved else "fa"})
    if upstream:
        want: str | None = next(s for s in ("stack", "seeding", "data_order") if s in upstream)
    elif "per_rank" in planted or (kr is not None and (kn is None or kr < kn)):  # per-rank state; a reduction first
        want = "distributed"
    elif kn is not None or kr is not None:
        want = "numerics"
    else:
        want = None
    return (run_a, run_b), want


def _named(pair: tuple[RepeatRun, RepeatRun]) -> str | None:
    return repeatability(list(pair)).source


def _planted(planted: tuple[str, ...]) -> Scenario:
    def trial(rng: np.random.Generator) -> bool:
        pair, want = simulate_distributed_pair(planted, rng)
        return _named(pair) == want

    return Scenario(name="+".join(planted), kind="planted",
                    description=f"planted {' + '.join(planted)}: the report must name the first cause", trial=trial)


def _false_distributed(planted: tuple[str, ...], *, kernels_first: bool = False) -> Scenario:
    def trial(rng: np.random.Generator) -> bool:
        while True:
            pair, want = simulate_distributed_pair(planted, rng)
            if not kernels_first or want == "numerics":
                return _named(pair) == "distributed"

    what = " + ".join(planted) or "nothing"
    extra = " (the kernels act first)" if kernels_first else ""
    return Scenario(name=f"{what}{extra}", kind="healthy",
                    description=f"planted {what}{extra}: naming distributed is a false alarm", trial=trial)


_SCENARIOS = [
    _false_distributed(()),
    _false_distributed(("numerics",)),
    _false_distributed(("reduction", "numerics"), kernels_first=True),
    *(_planted(p) for p in (("reduction",), ("per_rank",), ("reduction", "numerics"), ("per_rank", "numerics"),
                            ("data_order", "reduction"), ("seeding", "per_rank"), ("stack", "reduction"),
                            ("stack", "per_rank"))),
]

DISTRIBUTED_ATTRIBUTION = Rule(
    name="distributed attribution", nominal=0.0,
    guarantee="names distributed only when a rank's state disagrees with rank 0's or the all-reduce changed "
              "gradients every rank computed alike, after stack > seeding > data_order",
    scenarios=tuple(_SCENARIOS))
