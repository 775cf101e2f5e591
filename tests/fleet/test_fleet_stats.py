"""The fleet rule (steady.server.stats.fleet), in process: its false-alarm level over many simulated healthy
fleets, what it names when a fault is planted, and the rare-fault statement against SciPy's binomial."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import scipy.stats

from steady.server.stats import fleet

STEPS = 20


def _fleet(rng: np.random.Generator, *, workers: int, repeats: int, groups: int, fault=None, load: float = 2.0):
    """Runs of a healthy fleet: each fingerprint group has its own bits, every healthy run reproduces them; each
    worker's step times are lognormal around 1 ms times a load factor up to ``load``. ``fault(worker, repeat,
    values) -> values`` plants a fault on worker 0."""
    truth = {g: rng.standard_normal(STEPS) for g in range(groups)}
    runs = []
    for w in range(workers):
        g = w % groups
        slowdown = rng.uniform(1.0, load)
        for r in range(repeats):
            values = truth[g].copy()
            if fault is not None and w == 0:
                values = fault(r, values)
            digest = hashlib.sha256(values.tobytes()).hexdigest()  # the final weights follow the values
            runs.append(fleet.FleetRun(
                run_id=len(runs), worker=f"w{w}", group=f"g{g}", digests={"final_weights": digest},
                series={"loss": (np.arange(STEPS), values)},
                step_times=1e-3 * slowdown * rng.lognormal(0.0, 0.3, STEPS)))
    return runs


def test_healthy_fleets_name_nobody():
    """1000 healthy fleets (4–12 workers, 1–4 repeats, 1–3 fingerprint groups, machines loaded up to 2×): the
    numerics rule names no worker (its stated level is 0 while healthy devices repeat bit for bit), and the
    slow rule (×5 and Mann–Whitney at 1% over the group's workers) names at most 1% of the fleets."""
    rng = np.random.default_rng(45)
    named = slow = 0
    fleets = 1000
    for _ in range(fleets):
        workers = int(rng.integers(4, 13))
        result = fleet.fleet_check(_fleet(rng, workers=workers, repeats=int(rng.integers(1, 5)),
                                          groups=int(rng.integers(1, 4))))
        named += sum(len(g.findings) for g in result.groups)
        slow += bool(result.slow)
        assert all(g.has_majority for g in result.groups)
    assert named == 0
    assert slow / fleets <= 0.01


def test_a_workload_that_is_not_repeatable_names_nobody():
    """Where healthy devices do not repeat the workload bit for bit (every run its own bits) no result has a
    majority: the group says so and names no worker."""
    rng = np.random.default_rng(7)
    runs = _fleet(rng, workers=6, repeats=3, groups=1)
    noisy = [fleet.FleetRun(run_id=r.run_id, worker=r.worker, group=r.group, digests={"final_weights": str(i)},
                            series={"loss": (r.series["loss"][0], r.series["loss"][1] + rng.normal(0, 1e-9, STEPS))})
             for i, r in enumerate(runs)]
    (group,) = fleet.fleet_check(noisy).groups
    assert not group.has_majority and not group.findings


def test_consistent_and_intermittent_faults_are_told_apart():
    rng = np.random.default_rng(1)

    def wrong_kernel(repeat, values):
        out = values.copy()
        out[3:] *= 1 + 2.0 ** -40
        return out

    (group,) = fleet.fleet_check(_fleet(rng, workers=5, repeats=3, groups=1, fault=wrong_kernel)).groups
    (f,) = group.findings
    assert (f.worker, f.parted, f.runs, f.consistent, f.first_step, f.metric) == ("w0", 3, 3, True, 3, "loss")

    def flip_second_run(repeat, values):
        if repeat != 1:
            return values
        out = values.copy()
        out[11] = np.nextafter(out[11], np.inf)
        return out

    (group,) = fleet.fleet_check(_fleet(rng, workers=5, repeats=3, groups=1, fault=flip_second_run)).groups
    (f,) = group.findings
    assert (f.worker, f.parted, f.consistent, f.first_step) == ("w0", 1, False, 11)


def test_a_slow_worker_is_named_under_step_time_not_numerics():
    rng = np.random.default_rng(3)
    runs = _fleet(rng, workers=5, repeats=2, groups=1)
    runs = [fleet.FleetRun(run_id=r.run_id, worker=r.worker, group=r.group, digests=r.digests, series=r.series,
                           step_times=r.step_times * (50 if r.worker == "w2" else 1)) for r in runs]
    result = fleet.fleet_check(runs)
    assert [s.worker for s in result.slow] == ["w2"] and not result.groups[0].findings


@pytest.mark.parametrize("one_in", [20, 60])
def test_an_intermittent_fault_is_seen_as_often_as_the_binomial_says(one_in):
    """A fault striking each step with probability 1/K on worker 0: the share of fleets that name it matches
    seen_probability(repeats × steps, 1/K) (a 99.9% binomial interval over 1000 fleets)."""
    rng = np.random.default_rng(one_in)
    repeats, fleets, hits = 2, 1000, 0

    def intermittent(repeat, values):
        struck = np.flatnonzero(rng.random(STEPS) < 1 / one_in)
        if not struck.size:
            return values
        out = values.copy()
        out[struck[0]:] += 1e-3  # a wrong step: the run parts from then on
        return out

    for _ in range(fleets):
        result = fleet.fleet_check(_fleet(rng, workers=4, repeats=repeats, groups=1, fault=intermittent))
        hits += any(f.worker == "w0" for f in result.groups[0].findings)
    p = fleet.seen_probability(repeats * STEPS, 1 / one_in)
    low, high = scipy.stats.binom.interval(0.999, fleets, p)
    assert low <= hits <= high


@pytest.mark.parametrize("steps, rate", [(48, 1 / 16), (1000, 1e-3), (5, 0.5), (10**6, 1e-7)])
def test_the_rare_fault_statement_is_the_binomial(steps, rate):
    assert fleet.seen_probability(steps, rate) == pytest.approx(scipy.stats.binom.sf(0, steps, rate), rel=1e-12)
    seen = fleet.rate_seen(steps, 0.95)
    assert scipy.stats.binom.sf(0, steps, seen) == pytest.approx(0.95, rel=1e-9)
    repeats = fleet.repeats_for(rate, 10, 0.95)
    assert scipy.stats.binom.sf(0, repeats * 10, rate) >= 0.95
    assert repeats == 1 or scipy.stats.binom.sf(0, (repeats - 1) * 10, rate) < 0.95
