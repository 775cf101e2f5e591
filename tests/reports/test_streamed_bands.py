"""A cold /bands reads each group's runs block by block (``streamed_bands``): the same bands as the whole
load's ``compute_bands``, bit for bit, and the whole load for what only it can judge."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.kit.db import Database
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study, utcnow
from steady.server.reports import service
from steady.server.stats.bands import block_width
from steady.server.stats.report import compute_bands

STEPS = block_width(6) + 37  # a group of 6 runs: a block that ends inside a chunk, and a short last one
CHUNK = 5_000


def _study(db: Database, runs: list[dict], *, seed: int = 4) -> int:
    """A study whose runs (determinism, stack, seed, repeat, and optionally their own steps or values)
    logged ``loss`` in chunks of CHUNK steps, as a worker streams them."""
    rng = np.random.default_rng(seed)
    with db.write() as s:
        study = Study(name="bands", kind="external", status="completed", spec={})
        s.add(study)
        s.flush()
        for r in runs:
            run = Run(study_id=study.id, seed=r["seed"], repeat=r.get("repeat", 0), determinism=r["determinism"],
                      stack=r["stack"], framework="external", required_labels=[], status="completed", attempt=1,
                      max_attempts=1, fingerprint={}, digests={}, determinism_applied={}, timings={},
                      final_metrics={}, created_at=utcnow())
            s.add(run)
            s.flush()
            steps = r.get("steps", np.arange(STEPS))
            values = np.exp(-steps / 400.0) + rng.standard_t(3, steps.size) * 0.01
            for index, value in r.get("set", {}).items():
                values[index] = value
            for seq, lo in enumerate(range(0, steps.size, CHUNK)):
                metrics_repo.insert_chunks(s, run.id, 1, seq, [("loss", steps[lo:lo + CHUNK], values[lo:lo + CHUNK])])
        return study.id


def _both(db: Database, study_id: int, max_points: int | None = None):
    with db.read() as s:
        runs = service.completed_runs(s, study_id)
        streamed = service.streamed_bands(s, runs, metric="loss", coverage=0.9, confidence=0.95, max_points=max_points)
        whole = compute_bands(service.run_data(s, runs, ["loss"]), metric="loss", max_points=max_points)
    return streamed, whole


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        dx, dy = x.to_arrays(), y.to_arrays()
        assert dx.keys() == dy.keys()
        for key in dx:
            if isinstance(dx[key], np.ndarray):
                assert dx[key].tobytes() == dy[key].tobytes(), key
            elif key == "quantiles":
                assert all(dx[key][q].tobytes() == dy[key][q].tobytes() for q in dy[key])
            else:
                assert dx[key] == dy[key], key


@pytest.mark.parametrize("max_points", [None, 300])
def test_streamed_bands_are_the_whole_loads_bit_for_bit(db_url, max_points):
    """Two groups, repeats left out (one run per seed, its lowest repeat), rows by seed whatever the
    order the runs were made in, ties and -0.0, decimated or not."""
    db = Database(db_url)
    runs = [{"determinism": "seeded", "stack": "a", "seed": s} for s in (5, 1, 3, 2, 4, 0)]
    runs += [{"determinism": "seeded", "stack": "a", "seed": 1, "repeat": 1},
             {"determinism": "seeded", "stack": "a", "seed": 3, "repeat": 1}]
    runs += [{"determinism": "strict", "stack": "b", "seed": s, "set": {7: -0.0, 8: 0.0}} for s in range(3)]
    study_id = _study(db, runs)
    streamed, whole = _both(db, study_id, max_points)
    assert streamed is not None
    _same(streamed, whole)
    assert [b.group for b in streamed] == [{"determinism": "seeded", "stack": "a"},
                                           {"determinism": "strict", "stack": "b"}]
    assert streamed[0].one_run_per_seed and not streamed[1].one_run_per_seed
    assert streamed[0].band.n_runs == 6 and streamed[0].downsampled is (max_points is not None)
    db.dispose()


@pytest.mark.parametrize("case", ["diverged", "nan", "both"])
def test_a_run_with_a_value_not_finite_is_left_out_of_its_band(db_url, case):
    """A run that diverged (±Inf late in its series) or logged a NaN is excluded from its group's band, as
    the whole load excludes it: the group is read again without it, bit for bit the whole load's band."""
    db = Database(db_url)
    runs = [{"determinism": "seeded", "stack": "a", "seed": s} for s in range(6)]
    if case in ("diverged", "both"):
        runs[2]["set"] = {STEPS - 3: np.inf}
    if case in ("nan", "both"):
        runs[4]["set"] = {11: np.nan}
    study_id = _study(db, runs)
    streamed, whole = _both(db, study_id)
    assert streamed is not None
    _same(streamed, whole)
    assert len(streamed[0].excluded_run_ids) == (2 if case == "both" else 1)
    assert streamed[0].band.n_runs == 6 and set(streamed[0].band.n) == {6 - len(streamed[0].excluded_run_ids)}
    db.dispose()


@pytest.mark.parametrize("case", ["gap", "shorter", "irregular", "all_diverged"])
def test_what_is_not_one_grid_goes_to_the_whole_load(db_url, case):
    """Runs that do not share one gapless grid, or a group whose every run diverged: ``streamed_bands``
    declines (None), and /bands gives the whole load's answer."""
    db = Database(db_url)
    runs = [{"determinism": "seeded", "stack": "a", "seed": s} for s in range(4)]
    odd = runs[2]
    if case == "gap":
        odd["steps"] = np.concatenate([np.arange(CHUNK), np.arange(CHUNK + 1, STEPS + 1)])
    elif case == "shorter":
        odd["steps"] = np.arange(STEPS - CHUNK)
    elif case == "irregular":
        odd["steps"] = np.concatenate([[0, 2, 3], np.arange(4, STEPS + 1)])
    else:
        for r in runs:
            r["set"] = {5: np.inf}
    study_id = _study(db, runs)
    streamed, whole = _both(db, study_id)
    assert streamed is None
    with db.read() as s:
        answer = service.study_bands(s, study_id, metric="loss", coverage=0.9, confidence=0.95, max_points=None)
    assert [g["run_ids"] for g in answer["groups"]] == [b.run_ids for b in whole]
    assert [g["excluded_run_ids"] for g in answer["groups"]] == [b.excluded_run_ids for b in whole]
    assert answer["groups"][0]["mean"].tobytes() == whole[0].band.mean.tobytes()
    db.dispose()


def test_a_metric_no_run_logged_is_not_streamed(db_url):
    db = Database(db_url)
    study_id = _study(db, [{"determinism": "seeded", "stack": "a", "seed": 0}])
    with db.read() as s:
        runs = service.completed_runs(s, study_id)
        assert service.streamed_bands(s, runs, metric="acc", coverage=0.9, confidence=0.95, max_points=None) is None
    db.dispose()
