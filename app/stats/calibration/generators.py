"""Generators of realistic healthy studies and of studies with planted problems.

Every function takes an explicit ``numpy.random.Generator`` and returns plain arrays:
curves are ``runs × steps`` float64 matrices (NaN after a run's last logged step, ±Inf/NaN
from the step where a run diverged), final values are 1-D arrays. The other rule families
build their scenarios from these.

Healthy curves follow the model behind every seed-level rule:

    x_it = base_t + offset_i + noise_it · scale_t

* ``base_t`` — a smooth decreasing loss curve (``smooth_curve``), the same for every seed;
* ``offset_i`` — a persistent per-seed offset (seeds land in different basins), sd ``offset_sd``;
* ``noise_it`` — stationary AR(1) noise with lag-1 correlation ``rho`` and unit marginal sd,
  Gaussian or Student-t innovations (``tails``: "normal", "t3", "t5");
* ``scale_t`` — the noise sd at step t, ``noise`` times a factor that shrinks with the loss
  (``hetero=True``) or constant.

Runs generated this way are exchangeable: nothing distinguishes one seed from another, so any
rule that flags a run, or calls a group unstable at the stated limit, is a false alarm.
"""
from __future__ import annotations

import numpy as np
import scipy

__all__ = ["smooth_curve", "ar1_noise", "healthy_curves", "multiplicative_curves", "plant_late_blowup",
           "plant_offset", "plant_wider", "truncate_runs", "diverge_runs", "final_values",
           "FINAL_DISTRIBUTIONS", "TAILS", "resample_curves", "recorded_curves"]

TAILS = ("normal", "t3", "t5")
FINAL_DISTRIBUTIONS = ("normal", "t3", "t5", "lognormal", "lognormal0.6", "lognormal1", "gamma", "contaminated",
                       "uniform")
SEED_EFFECTS = ("rate", "scale")


def _rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    return rng


def smooth_curve(n_steps: int, *, start: float = 2.5, floor: float = 0.3, tau: float | None = None) -> np.ndarray:
    """A smooth decreasing loss curve: floor + (start − floor)·exp(−t/τ), τ = n_steps/5 by default."""
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    t = np.arange(n_steps, dtype=np.float64)
    tau = n_steps / 5.0 if tau is None else float(tau)
    return floor + (start - floor) * np.exp(-t / max(tau, 1e-12))


def _unit_draws(rng: np.random.Generator, dist: str, size) -> np.ndarray:
    """Draws with mean 0 and variance 1 from ``dist`` (see FINAL_DISTRIBUTIONS)."""
    if dist == "normal":
        return rng.standard_normal(size)
    if dist in ("t3", "t5"):
        nu = int(dist[1:])
        return rng.standard_t(nu, size) / np.sqrt(nu / (nu - 2.0))
    if dist == "lognormal":  # log-sd 0.5: skewness 1.75, excess kurtosis 5.9
        s = 0.5
        x = rng.lognormal(0.0, s, size)
        return (x - np.exp(s * s / 2)) / np.sqrt((np.exp(s * s) - 1) * np.exp(s * s))
    if dist == "lognormal0.6":  # log-sd 0.6: skewness 2.26, excess kurtosis 11 (heavier than the calibration's 0.5)
        s = 0.6
        x = rng.lognormal(0.0, s, size)
        return (x - np.exp(s * s / 2)) / np.sqrt((np.exp(s * s) - 1) * np.exp(s * s))
    if dist == "lognormal1":  # log-sd 1: skewness 6.2 (a strongly skewed seed effect)
        x = rng.lognormal(0.0, 1.0, size)
        return (x - np.exp(0.5)) / np.sqrt((np.e - 1) * np.e)
    if dist == "gamma":  # shape 2: skewness 1.41, excess kurtosis 3
        return (rng.gamma(2.0, 1.0, size) - 2.0) / np.sqrt(2.0)
    if dist == "contaminated":  # 90% N(0, 1), 10% N(0, 3²): excess kurtosis 7.3
        scale = np.where(rng.random(size) < 0.1, 3.0, 1.0)
        return rng.standard_normal(size) * scale / np.sqrt(1.8)
    if dist == "uniform":  # light tails (excess kurtosis −1.2)
        return rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), size)
    raise ValueError(f"unknown distribution {dist!r}; known: {FINAL_DISTRIBUTIONS}")


def ar1_noise(rng: np.random.Generator, n_runs: int, n_steps: int, *, rho: float, tails: str = "normal") -> np.ndarray:
    """Stationary AR(1) noise, ``runs × steps``, unit marginal variance, lag-1 correlation ``rho``.

    e_t = ρ e_{t−1} + √(1−ρ²) u_t with unit-variance innovations u (normal or Student-t scaled
    to variance 1); e_0 = u_0, so the process starts stationary."""
    _rng(rng)
    if not (0.0 <= rho < 1.0):
        raise ValueError(f"rho must be in [0, 1), got {rho!r}")
    if tails not in TAILS:
        raise ValueError(f"tails must be one of {TAILS}, got {tails!r}")
    u = _unit_draws(rng, tails, (n_runs, n_steps))
    if rho == 0.0:
        return u
    v = np.sqrt(1.0 - rho * rho) * u
    v[:, 0] = u[:, 0]
    return scipy.signal.lfilter([1.0], [1.0, -rho], v, axis=1)  # out_t = ρ out_{t−1} + v_t, one C loop


def healthy_curves(rng: np.random.Generator, n_runs: int, n_steps: int, *, rho: float = 0.9,
                   offset_sd: float = 0.02, noise: float = 0.02, tails: str = "normal",
                   offset_dist: str = "normal", hetero: bool = True, base=None) -> np.ndarray:
    """A healthy seed study: ``runs × steps`` loss curves (see the module docstring for the model).

    ``offset_dist`` is the distribution of the per-seed offsets (any of FINAL_DISTRIBUTIONS, scaled
    to sd ``offset_sd``); ``base`` overrides ``smooth_curve(n_steps)``."""
    _rng(rng)
    b = smooth_curve(n_steps) if base is None else np.asarray(base, dtype=np.float64)
    if b.shape != (n_steps,):
        raise ValueError(f"base must have shape ({n_steps},), got {b.shape}")
    scale = noise * (0.5 + 0.5 * b / b[0]) if hetero else np.full(n_steps, float(noise))
    offsets = offset_sd * _unit_draws(rng, offset_dist, n_runs)
    return b[None, :] + offsets[:, None] + ar1_noise(rng, n_runs, n_steps, rho=rho, tails=tails) * scale[None, :]


def multiplicative_curves(rng: np.random.Generator, n_runs: int, n_steps: int, *, on: str, logsd: float,
                          rho: float = 0.9, offset_sd: float = 0.02, noise: float = 0.02,
                          start: float = 2.5, floor: float = 0.3) -> np.ndarray:
    """A healthy seed study where each seed acts multiplicatively, so the spread across seeds is
    right-skewed: ``x_it = floor + (start − floor)·g_i(t) + offset_i + noise_it``, with a per-seed
    factor F_i ~ lognormal(0, ``logsd``) either on the decay rate (``on="rate"``:
    g_i(t) = exp(−F_i t/τ), a per-seed learning speed) or on the excess loss (``on="scale"``:
    g_i(t) = F_i exp(−t/τ)), τ = n_steps/5; offsets and AR(1) noise as in ``healthy_curves``
    (constant noise sd). Exchangeable runs: a flag is a false alarm."""
    _rng(rng)
    if on not in SEED_EFFECTS:
        raise ValueError(f"on must be one of {SEED_EFFECTS}, got {on!r}")
    if not logsd >= 0:
        raise ValueError(f"logsd must be >= 0, got {logsd!r}")
    t = np.arange(n_steps, dtype=np.float64)
    tau = n_steps / 5.0
    f = rng.lognormal(0.0, logsd, n_runs)
    g = np.exp(-f[:, None] * t[None, :] / tau) if on == "rate" else f[:, None] * np.exp(-t / tau)[None, :]
    offsets = offset_sd * rng.standard_normal(n_runs)
    return floor + (start - floor) * g + offsets[:, None] + noise * ar1_noise(rng, n_runs, n_steps, rho=rho)


def plant_late_blowup(curves, *, runs=(0,), factor: float = 40.0, fraction: float = 0.1) -> np.ndarray:
    """A copy of ``curves`` where each run in ``runs`` stays in the band and then, over the last
    ``fraction`` of its steps, grows geometrically to ``factor`` times its value (a late blow-up
    that does not reach Inf/NaN: ×1 at the window's first step, ×``factor`` at the last)."""
    out = np.array(curves, dtype=np.float64, copy=True)
    n_steps = out.shape[1]
    width = max(2, int(round(fraction * n_steps)))
    ramp = np.geomspace(1.0, float(factor), width)
    for r in runs:
        out[r, n_steps - width:] *= ramp
    return out


def plant_offset(curves, shift: float, *, run: int = 0) -> np.ndarray:
    """A copy of ``curves`` with run ``run`` shifted by ``shift`` at every step (a bad seed)."""
    out = np.array(curves, dtype=np.float64, copy=True)
    out[run] += shift
    return out


def plant_wider(rng: np.random.Generator, n_runs: int, n_steps: int, *, factor: float, **kw) -> np.ndarray:
    """A study whose seed band is ``factor`` times wider than the healthy one (offsets and noise scaled)."""
    kw = dict(kw)
    kw["offset_sd"] = kw.get("offset_sd", 0.02) * factor
    kw["noise"] = kw.get("noise", 0.02) * factor
    return healthy_curves(rng, n_runs, n_steps, **kw)


def truncate_runs(rng: np.random.Generator, curves, *, n_short: int, min_fraction: float = 0.4) -> np.ndarray:
    """A copy of ``curves`` where ``n_short`` random runs stopped early (NaN after a random last
    step between ``min_fraction`` and 100% of the steps): unequal run lengths, not divergence."""
    _rng(rng)
    out = np.array(curves, dtype=np.float64, copy=True)
    n_runs, n_steps = out.shape
    for i in rng.choice(n_runs, size=min(n_short, n_runs), replace=False):
        last = int(rng.integers(max(1, int(min_fraction * n_steps)), n_steps))
        out[i, last:] = np.nan
    return out


def diverge_runs(rng: np.random.Generator, curves, *, n_diverged: int, value: float = np.inf) -> np.ndarray:
    """A copy of ``curves`` where ``n_diverged`` random runs turn non-finite (``value``) from a
    random step on (a diverged run: the loss blew up)."""
    _rng(rng)
    out = np.array(curves, dtype=np.float64, copy=True)
    n_runs, n_steps = out.shape
    for i in rng.choice(n_runs, size=min(n_diverged, n_runs), replace=False):
        out[i, int(rng.integers(1, n_steps)):] = value
    return out


def final_values(rng: np.random.Generator, n: int, *, sd: float, dist: str = "normal", mean: float = 0.0) -> np.ndarray:
    """``n`` final metric values (one per seed) with population sd exactly ``sd`` from ``dist``:
    normal, Student t3/t5, lognormal (log-sd 0.5; ``lognormal1``: log-sd 1), gamma (shape 2),
    contaminated normal (10% with 3× sd), uniform."""
    _rng(rng)
    return mean + sd * _unit_draws(rng, dist, n)


def resample_curves(rng: np.random.Generator, curves, n_runs: int, *, block: int = 20) -> np.ndarray:
    """New healthy runs from recorded ones (e.g. a built-in workload's seeds): each new run is the
    recorded mean curve + one recorded run's offset from the mean (drawn at random) + the moving-
    block bootstrap (Künsch 1989) of that run's within-run residuals, blocks of ``block`` steps.
    Keeps the recorded curves' shape, seed-to-seed spread and step autocorrelation."""
    _rng(rng)
    x = np.asarray(curves, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or not np.all(np.isfinite(x)):
        raise ValueError("curves must be a finite runs × steps matrix with at least 2 runs")
    mean = x.mean(axis=0)
    dev = x - mean
    level = dev.mean(axis=1)
    resid = dev - level[:, None]
    m = x.shape[1]
    block = max(1, min(block, m))
    out = np.empty((n_runs, m))
    for i in range(n_runs):
        src = int(rng.integers(x.shape[0]))
        starts = rng.integers(0, m - block + 1, size=-(-m // block))
        idx = (starts[:, None] + np.arange(block)[None, :]).ravel()[:m]
        r = resid[int(rng.integers(x.shape[0])), idx]
        out[i] = mean + level[src] + r - r.mean()
    return out


def recorded_curves(workload: str = "torch_mlp") -> np.ndarray:
    """The loss curves (seeds × steps) a built-in workload recorded (``scripts/record-workload-curves``),
    for ``resample_curves``."""
    if workload != "torch_mlp":
        raise ValueError(f"no recorded curves for {workload!r} (recorded: torch_mlp)")
    from steady.server.stats.calibration import recorded_torch_mlp as rec

    return np.asarray(rec.CURVES, dtype=np.float64)
