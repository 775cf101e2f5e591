"""app/stats/downsample.py: the one min/max-per-bucket decimation (report bands and dashboard charts)."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.downsample import bucket_extremes, extreme_indices


def test_bucket_extremes_on_a_hand_checked_matrix():
    # 8 steps, max_points 4 -> 2 buckets [0, 4) and [4, 8)
    m = np.array([[3.0, 1.0, 9.0, 2.0, 5.0, 5.0, 7.0, 0.0],
                  [np.nan, np.nan, np.inf, np.nan, 1.0, -2.0, 4.0, 8.0]])
    present = np.ones(m.shape, dtype=bool)
    present[1, :4] = [False, True, True, False]  # row 1 logged NaN at 1 and +Inf at 2 in bucket 1
    x, v, absent = bucket_extremes(m, max_points=4, present=present)
    assert x.tolist() == [0, 3, 4, 7]
    # row 0: bucket 1 min 1 (pos 1) before max 9 (pos 2); bucket 2 max 7 (pos 6) before min 0 (pos 7)
    assert v[0].tolist() == [1.0, 9.0, 7.0, 0.0] and not absent.any()
    # row 1: bucket 1 has no finite value: the first non-finite value it logged (NaN at pos 1);
    # bucket 2 min -2 (pos 5) before max 8 (pos 7)
    assert np.isnan(v[1, :2]).all() and v[1, 2:].tolist() == [-2.0, 8.0]
    # with nothing logged in bucket 1 the series is absent there, not NaN
    present[1, :4] = False
    _, _, absent = bucket_extremes(m, max_points=4, present=present)
    assert absent[1].tolist() == [True, True, False, False]
    # a bucket holding only +Inf shows it (a diverged run stays visible)
    m[1, :4] = [np.nan, np.inf, np.inf, np.nan]
    present[1, :4] = [False, True, True, False]
    _, v, _ = bucket_extremes(m, max_points=4, present=present)
    assert v[1, :2].tolist() == [np.inf, np.inf]


def test_bucket_extremes_keeps_every_series_spike_on_the_shared_axis():
    rng = np.random.default_rng(7)
    m = rng.normal(size=(3, 20_000))
    m[1, 12_345] = 50.0
    m[2, 777] = -40.0
    x, v, _ = bucket_extremes(m, max_points=1000)
    assert x.size == 1000 and v.shape == (3, 1000) and np.all(np.diff(x) >= 0)
    assert np.nanmax(v[1]) == 50.0 and np.nanmin(v[2]) == -40.0
    # the same buckets as extreme_indices: each bucket's extremes of a row are among its indices
    idx = extreme_indices(m[0], max_points=1000)
    assert sorted(set(m[0, idx])) == sorted(set(v[0]))


def test_bucket_extremes_returns_a_short_series_whole():
    m = np.array([[1.0, np.nan, np.inf, 4.0]])
    x, v, absent = bucket_extremes(m, max_points=100)
    assert x.tolist() == [0, 1, 2, 3] and not absent.any()
    assert v[0, 0] == 1.0 and np.isnan(v[0, 1]) and v[0, 2] == np.inf and v[0, 3] == 4.0


@pytest.mark.parametrize("bad", [1, 2.5])
def test_max_points_is_validated_in_one_place(bad):
    with pytest.raises(ValueError, match="max_points"):
        bucket_extremes(np.zeros((1, 10)), max_points=bad)
    with pytest.raises(ValueError, match="max_points"):
        extreme_indices(np.zeros(10), max_points=bad)


def test_bucket_extremes_wants_series_by_steps():
    with pytest.raises(ValueError, match="2-D"):
        bucket_extremes(np.zeros(10), max_points=4)
