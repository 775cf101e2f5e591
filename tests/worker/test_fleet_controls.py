"""The fleet controls' judgment (``steady demo --controls --fleet``) on reports made by hand, and the bound it states
on the false-alarm rate against statsmodels' Clopper–Pearson interval. The controls themselves (a server and five
agents) run in `make results`; tests/fleet/test_fleet_e2e.py runs one check of every fault."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from statsmodels.stats.proportion import proportion_confint

from steady.server.cli.demo.fleet_controls import CONTROLS, judge, upper_bound

HEALTHY = ["healthy-1", "healthy-2", "healthy-3", "healthy-4"]


def report(findings=(), slow=(), status="fail"):
    group = NS(findings=[NS(worker=w, kind=k, first_step=s) for w, k, s in findings])
    return NS(fleet=NS(groups=[group], slow=[NS(worker=w) for w in slow]), outcome=NS(status=status))


@pytest.mark.parametrize(("alarms", "judged"), [(0, 105), (0, 20), (1, 50), (3, 20)])
def test_the_false_alarm_bound_is_the_one_sided_clopper_pearson_bound(alarms, judged):
    _, upper = proportion_confint(alarms, judged, alpha=0.10, method="beta")  # two-sided 90%: one-sided 95% upper
    assert upper_bound(alarms, judged) == pytest.approx(upper, rel=1e-9)
    if alarms == 0:
        assert upper_bound(0, judged) == pytest.approx(1 - 0.05 ** (1 / judged), rel=1e-9)


def test_a_check_counts_when_it_names_the_faulty_worker_as_its_kind_requires_and_no_healthy_one():
    kernel = next(c for c in CONTROLS if c.fault == "wrong_kernel")
    row = judge(kernel, [report([("bad", "consistent", 0)]), report([("bad", "consistent", 0)])], "bad", HEALTHY, 1.0)
    assert (row.named, row.checks, row.kinds, row.steps, row.healthy_named, row.healthy_judged) == (
        2, 2, ("consistent",), (0,), 0, 8)
    assert row.ok
    missed = judge(kernel, [report([("bad", "consistent", 0)]), report(status="pass")], "bad", HEALTHY, 1.0)
    assert missed.named == 1 and not missed.ok
    alarm = judge(kernel, [report([("bad", "consistent", 0), ("healthy-2", "intermittent", 5)])], "bad", HEALTHY, 1.0)
    assert alarm.named == 1 and alarm.healthy_named == 1 and not alarm.ok


def test_the_slow_device_counts_only_when_named_slow_and_not_as_a_numerics_fault():
    slow = next(c for c in CONTROLS if c.named_as == "slow")
    assert judge(slow, [report(slow=["bad"])], "bad", HEALTHY, 1.0).named == 1
    assert judge(slow, [report([("bad", "consistent", 3)], slow=["bad"])], "bad", HEALTHY, 1.0).named == 0
    assert judge(slow, [report(slow=["bad", "healthy-1"])], "bad", HEALTHY, 1.0).healthy_named == 1


def test_with_no_fault_the_fifth_worker_is_healthy_too():
    none = next(c for c in CONTROLS if c.fault is None)
    clean = judge(none, [report(status="pass")] * 3, "planted-none", HEALTHY, 1.0)
    assert (clean.healthy_named, clean.healthy_judged, clean.ok) == (0, 15, True)
    named = judge(none, [report(slow=["planted-none"])], "planted-none", HEALTHY, 1.0)
    assert named.healthy_named == 1 and not named.ok
