"""Run endpoints: reading runs and series (users), and the worker side of the protocol."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from steady.server.kit.deps import AppSettings, HeavyReader, ProtocolCaller, ReadDB, UserCaller, WriteDB
from steady.server.kit.errors import NotFound
from steady.server.metrics import repository as metrics_repo
from steady.server.lifecycle import ingest, service, transitions
from steady.server.runs.schemas import ExcludeIn, RunOut, SeriesOut
from steady.worker.contract.protocol import (
    BatchAck,
    Heartbeat,
    HeartbeatAck,
    MetricBatch,
    RunAck,
    RunFailure,
    RunRelease,
    RunResult,
    RunSpec,
)

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@router.get("/{run_id}", response_model=RunOut)
def get_run(run_id: int, db: ReadDB, caller: UserCaller) -> RunOut:
    run = service.get_run(db, run_id)
    out = RunOut.model_validate(run, from_attributes=True)
    out.metric_keys = metrics_repo.metric_keys(db, [run.id]).get(run.id, [])
    out.story = service.run_story(db, run)
    return out


@router.get("/{run_id}/spec", response_model=RunSpec)
def get_run_spec(run_id: int, db: ReadDB, caller: UserCaller) -> RunSpec:
    """What a worker gets to execute the run (its lease's spec, no credential): what `steady localize`
    replays."""
    return service.run_spec(db, service.get_run(db, run_id))


@router.post("/{run_id}/exclude", response_model=RunOut)
def exclude_run(run_id: int, body: ExcludeIn, db: WriteDB, caller: UserCaller) -> RunOut:
    """Leave the run out of reports, bands and alerts (the study's owner or an admin). The run and
    its data stay; reports list it as excluded with who, when and why."""
    return RunOut.model_validate(service.exclude_run(db, run_id, body.reason, caller), from_attributes=True)


@router.delete("/{run_id}/exclude", response_model=RunOut)
def include_run(run_id: int, db: WriteDB, caller: UserCaller) -> RunOut:
    """Undo an exclusion: the run is judged again."""
    return RunOut.model_validate(service.include_run(db, run_id, caller), from_attributes=True)


@router.get("/{run_id}/metrics/{key:path}", response_model=SeriesOut)  # keys may hold "/" (TensorBoard tags)
def get_series(
    caller: HeavyReader,
    run_id: int,
    key: str,
    db: ReadDB,
    format: Annotated[Literal["json", "packed"], Query(description="packed: base64 <i8 steps and <f8 values")] = "json",
) -> SeriesOut:
    service.get_run(db, run_id)
    series = metrics_repo.load_series(db, [run_id], [key]).get((run_id, key))
    if series is None:
        raise NotFound(f"run {run_id} has no metric {key!r}")
    steps, values = series
    if format == "packed":
        return SeriesOut(
            run_id=run_id,
            key=key,
            n=len(steps),
            steps_b64=base64.b64encode(steps.astype("<i8").tobytes()).decode(),
            values_b64=base64.b64encode(values.astype("<f8").tobytes()).decode(),
        )
    # trusted arrays: built without validating 10^5 floats again (the serializer spells NaN and ±Inf)
    return SeriesOut.model_construct(run_id=run_id, key=key, n=len(steps), steps=steps.tolist(), values=values.tolist())


# --- worker side ----------------------------------------------------------------------------


# The worker protocol runs on capacity of its own (steady.server.kit.capacity): its routes are async,
# and each does its database work in one call on the protocol's threads and connections, never the
# shared thread pool or connection pool that user requests use. The write session is opened, used and
# committed in that one thread, so it may queue for the process's SQLite write lock
# (``Database.write``), which a session spread over a dependency's several thread-pool calls may not.
# A metric batch is decoded in the request and stored by the process's group committer (on the
# protocol's connections), which holds that lock per group.


@router.post("/{run_id}/heartbeat", response_model=HeartbeatAck, tags=["worker protocol"])
async def heartbeat(run_id: int, body: Heartbeat, request: Request, caller: ProtocolCaller, settings: AppSettings):
    return await request.app.state.protocol.write(transitions.heartbeat, run_id, body, settings, caller)


@router.post("/{run_id}/metrics", response_model=BatchAck, tags=["worker protocol"])
async def push_metrics(run_id: int, body: MetricBatch, request: Request, caller: ProtocolCaller,
                       settings: AppSettings):
    """Answered once the batch is committed (on SQLite: fsynced). Batches that arrive while a
    commit is in flight are stored together in the next transaction, each checked on its own."""
    batch = ingest.prepare(run_id, body, settings)
    return await ingest.submit(request.app.state.committer, batch, settings, caller)


@router.post("/{run_id}/complete", response_model=RunAck, tags=["worker protocol"])
async def complete(run_id: int, body: RunResult, request: Request, caller: ProtocolCaller):
    return await request.app.state.protocol.write(transitions.complete, run_id, body, caller)


@router.post("/{run_id}/fail", response_model=RunAck, tags=["worker protocol"])
async def fail(run_id: int, body: RunFailure, request: Request, caller: ProtocolCaller):
    return await request.app.state.protocol.write(transitions.fail, run_id, body, caller)


@router.post("/{run_id}/release", response_model=RunAck, tags=["worker protocol"])
async def release(run_id: int, body: RunRelease, request: Request, caller: ProtocolCaller):
    return await request.app.state.protocol.write(transitions.release, run_id, body, caller)
