"""Alert rules as users write them, in a study spec (``alerts``) or over REST (``POST /alert-rules``).

The grammar of a study spec, so it lives with the studies domain: ``StudySpec`` embeds
``AlertRuleSpec``, and the alerts domain (``steady.server.alerts``) reads rules in this form. Pydantic
only: no database, no other domain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter

from steady.worker.contract.protocol import MAX_NAME_LENGTH, Determinism, MetricKey

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
StackName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:+\-]+$")]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def _addressable(name: str) -> str:
    """A suite name is one segment of ``/api/v1/suites/{suite}/baseline``: a ``/`` or ``\\`` splits it,
    ``.`` and ``..`` are rewritten by clients, a control character cannot be typed; such a suite could
    never get a baseline, so it is refused when the study is submitted."""
    bad = sorted({c for c in name if c in "/\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"a suite name may not contain {', '.join(map(repr, bad))}: it names a URL path segment")
    if set(name) == {"."}:
        raise ValueError(f"a suite name may not be {name!r}: it names a URL path segment")
    return name


SuiteName = Annotated[Name, AfterValidator(_addressable)]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name | None = Field(None, description="unique within its scope; default '<kind>:<metric>'")
    severity: Severity = "warning"
    determinism: Annotated[list[Determinism], Field(min_length=1)] | None = Field(
        None, description="only judge groups of these determinism levels (default: all, or the kind's own)"
    )
    stack: StackName | None = Field(None, description="only judge this stack")
    # Scope, for rules created over REST. In a study spec the rule applies to that study
    # (or its suite, when it has one) and these must be left out.
    study_id: Annotated[int, Field(ge=1)] | None = None
    suite: SuiteName | None = None

    @property
    def rule_name(self) -> str:
        metric = getattr(self, "metric", None)
        return self.name or (f"{self.kind}:{metric}" if metric else self.kind)  # type: ignore[attr-defined]

    def params(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"name", "kind", "metric", "severity", "study_id", "suite"})


class BandWidthRule(_Rule):
    """The seed-stability band of a metric's final value is wider than a limit."""

    kind: Literal["band_width"]
    metric: MetricKey
    stat: Literal["std", "ti_width"] = Field(
        "std", description="std: standard deviation over seeds (fires when its one-sided lower confidence bound "
        "exceeds max); ti_width: width of the normal tolerance interval (fires when it exceeds max)"
    )
    max: PositiveFloat
    alpha: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.05, description="std: false-alarm probability per study and group when the true std equals max"
    )


class OutOfBaselineRule(_Rule):
    """A run of a suite's study falls outside the baseline's range: final mode, its final value; curve mode,
    its whole-curve level. Both judged by the baseline's prediction interval corrected for the number of
    candidate runs, at false-alarm level ``alpha``."""

    kind: Literal["out_of_baseline"]
    metric: MetricKey
    mode: Literal["final", "curve"] = Field(
        "final", description="final: the final value; curve: the whole-curve level (every step, standardised by "
        "the baseline's per-step spread), valid for autocorrelated steps"
    )
    max_share: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.1, description="deprecated and unused: curve mode used to fire past this share of steps outside the "
        "per-step band (no stated false-alarm level); it is now judged at level alpha like final mode"
    )
    alpha: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.01, description="probability that a healthy study raises the alert, per stack and determinism "
        "level, whatever its number of runs (prediction interval, Bonferroni over the candidate runs)"
    )


class RepeatabilityLostRule(_Rule):
    """Repeats of one seed are no longer bitwise identical (default: strict runs)."""

    kind: Literal["repeatability_lost"]
    metric: MetricKey


class DivergedRule(_Rule):
    """A run logged a non-finite value (NaN or ±Inf) of the metric."""

    kind: Literal["diverged"]
    metric: MetricKey


class NotEquivalentRule(_Rule):
    """A candidate stack is not equivalent to the reference stack of the study or the suite's baseline."""

    kind: Literal["not_equivalent"]
    metric: MetricKey
    margin: PositiveFloat | None = Field(
        None, description="equivalence margin against the suite baseline (default: the metric's margin)"
    )
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05


class DeterminismCostRule(_Rule):
    """The step-time ratio between two determinism levels is above a limit."""

    kind: Literal["determinism_cost"]
    max_ratio: PositiveFloat
    numerator: Determinism = Determinism.strict
    denominator: Determinism | None = Field(None, description="default: every level the report compares with")


class SuiteShiftRule(_Rule):
    """The suite's history of a final metric (one mean per study and group, since the baseline) shifted.

    One history per (stack, determinism level), watched by a self-starting CUSUM re-evaluated
    after every study (``steady.server.stats.changepoint.sequential_shift``)."""

    kind: Literal["suite_shift"]
    metric: MetricKey
    alpha: Annotated[float, Field(gt=0, le=0.5)] = Field(
        0.01, description="probability of any false alarm over the first `horizon` studies since the baseline, "
        "per stack and determinism level, when nothing changed"
    )
    horizon: Annotated[int, Field(ge=1, le=10_000)] = Field(
        100, description="number of studies the lifetime false-alarm budget `alpha` covers"
    )
    min_history: Annotated[int, Field(ge=3, le=10_000)] = 6
    direction: Literal["both", "increase", "decrease"] = "both"


AlertRuleSpec = Annotated[
    BandWidthRule | OutOfBaselineRule | RepeatabilityLostRule | DivergedRule | NotEquivalentRule | DeterminismCostRule | SuiteShiftRule,
    Field(discriminator="kind"),
]
RULE_KINDS = ("band_width", "out_of_baseline", "repeatability_lost", "diverged", "not_equivalent",
              "determinism_cost", "suite_shift")
rule_adapter: TypeAdapter = TypeAdapter(AlertRuleSpec)


def check_spec_alerts(alerts: Sequence[_Rule], metric_names: list[str], suite: str | None) -> None:
    """Checks of a study spec's ``alerts`` that need the rest of the spec; ValueError names the item."""
    names = set()
    for i, rule in enumerate(alerts):
        where = f"alerts[{i}] ({rule.kind})"  # type: ignore[attr-defined]
        metric = getattr(rule, "metric", None)
        if metric is not None and metric not in metric_names:
            raise ValueError(f"{where}: metric {metric!r} is not one of the study's metrics {metric_names}")
        if rule.study_id is not None or rule.suite is not None:
            raise ValueError(f"{where}: leave out study_id and suite; a spec's rules apply to the study and its suite")
        if rule.kind in ("suite_shift", "out_of_baseline") and not suite:  # type: ignore[attr-defined]
            raise ValueError(f"{where}: this rule compares studies of a suite; give the study a 'suite'")
        if rule.rule_name in names:
            raise ValueError(f"{where}: two rules named {rule.rule_name!r}; give them distinct 'name's")
        names.add(rule.rule_name)
