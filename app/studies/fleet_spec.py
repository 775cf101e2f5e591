"""The ``fleet`` section of a study spec (``steady.server.studies.fleet`` queues its runs)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from steady.server.studies.spec_parts import _Spec
from steady.worker.contract.protocol import MAX_NAME_LENGTH

WorkerName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]


class FleetWorker(_Spec):
    id: int
    name: str


class FleetSpec(_Spec):
    """A fleet check: which worker of a pool computes differently from its peers (docs/fleet.md)."""

    workers: Annotated[list[WorkerName], Field(max_length=10_000)] | None = Field(
        None, description="the pool by worker name (default: every worker seen within alive_s)")
    labels: Annotated[list[str], Field(max_length=100)] = Field(
        [], description="only workers carrying all these labels ({k: v} is read as the labels 'k=v')")
    repeats: Annotated[int, Field(ge=1, le=100)] = Field(
        3, description="runs per worker; two or more tell an intermittent fault from a consistent one")
    alive_s: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        120.0, description="a worker is in the pool when it was seen (polled or heartbeated) this recently")
    wait_s: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        1800.0, description="a pinned run its worker has not taken this long after submission fails with the "
        "reason (the worker is gone), so the check ends instead of waiting for it")
    slow_ratio: Annotated[float, Field(gt=1, le=1000, allow_inf_nan=False)] = Field(
        5.0, description="a worker is named slow when its median step time is at least this many times its "
        "group's other workers' (and a Mann–Whitney test at 1% / workers agrees)")
    plan_one_in: Annotated[int, Field(ge=2, le=10**12)] | None = Field(
        None, description="plan repeats for an intermittent fault that strikes 1 step in this many")
    quarantine: bool = Field(
        False, description="quarantine every worker the check names (its runs part from its peers', or it is "
        "slow): it then leases no run of a study that respects quarantine until an admin releases it")
    pool: list[FleetWorker] | None = Field(
        None, description="set by the server: the workers the check was pinned to, as resolved at submission")

    @field_validator("labels", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return [f"{k}={v}" for k, v in sorted(value.items())]
        return value
