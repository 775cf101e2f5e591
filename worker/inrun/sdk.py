"""The small SDK user training code logs through.

    from steady.worker.inrun import sdk

    for step, batch in enumerate(loader):
        loss = train_step(batch)
        sdk.log(step=step, loss=loss)
    sdk.set_digest("final_weights", sdk.digest_model(model))

Inside a Steady run (the harness sets ``STEADY_EVENTS_FILE``) every call writes an event the
agent streams to the server. Outside a run the calls do nothing beyond a one-time notice
on stderr, so the same script still runs on a laptop. Importing this module needs neither
the server nor a framework; ``digest_model`` imports the framework of the model it is given.

``step_time`` (seconds) is recorded automatically as the wall time between two ``log`` calls
at consecutive steps, unless the caller passes ``step_time=`` itself (the built-in workloads
time the training step precisely).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from steady.worker.contract.digests import file_digest, order_digest, state_digest
from steady.worker.contract import sources
from steady.worker.contract.events import EVENTS_ENV, EventWriter
from steady.worker.contract.resume import CHECKPOINT_ENV
from steady.worker.inrun.steptimes import StepTimes

STEP_TIME_KEY = "step_time"  # same value as steady.worker.contract.protocol.STEP_TIME_KEY (no pydantic import here)
DIGEST_KINDS = ("initial_weights", "final_weights", "optimizer_state", "data_order")


@dataclass
class RunContext:
    """What a workload or user entrypoint gets: the run's spec and the determinism in force."""

    seed: int
    determinism: str  # "none" | "seeded" | "strict"
    framework: str
    params: dict[str, Any] = field(default_factory=dict)
    threads: int = 2
    repeat: int = 0
    device: str = "cpu"  # "cpu" or "cuda" (CUDA_VISIBLE_DEVICES already narrowed to one GPU)
    work_dir: str = "."
    # where the code keeps its checkpoints: the resume check gives each launch its own (steady.worker.inrun.resume)
    checkpoint_dir: str = ""

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> RunContext:
        """The context of a run from its spec file (``steady.worker.contract.events.SPEC_ENV``)."""
        return cls(
            seed=int(spec["seed"]),
            determinism=spec["determinism"],
            framework=spec["framework"],
            params=dict(spec.get("params") or {}),
            threads=int(spec.get("threads") or 2),
            repeat=int(spec.get("repeat") or 0),
            device=spec.get("device") or "auto",
            work_dir=spec.get("work_dir") or os.getcwd(),
            checkpoint_dir=os.environ.get(CHECKPOINT_ENV)
            or os.path.join(spec.get("work_dir") or os.getcwd(), "checkpoints"),
        )

    @property
    def seeded(self) -> bool:
        return self.determinism in ("seeded", "strict")

    @property
    def data_seed(self) -> int | None:
        """Seed for shuffles and data-loader generators; None at ``none`` (fresh entropy)."""
        return self.seed if self.seeded else None

    def seed_for(self, source: str) -> int | None:
        """This run's seed for one source of variance: ``init``, ``data``, ``dropout``, ``numerics`` or ``ulp``
        (:mod:`steady.worker.contract.sources`). In a sources study a pinned source gets the same seed in every
        run of its arm; ``ulp`` gives the index of the weight to move by one ULP at step 0, or None (move none).
        At determinism ``none`` every source but ``ulp`` gives None (fresh entropy). Asking records the source
        as exposed, so the report tells a source the code never asked for from one that adds no variance."""
        value = sources.seed_for(source, seed=self.seed, params=self.params)
        _expose(source)
        if source != "ulp" and not self.seeded:
            return None
        return value

    def numpy_rng(self, offset: int = 0):
        import numpy as np

        return np.random.default_rng(None if self.data_seed is None else self.data_seed + offset)

    def param(self, name: str, default: Any) -> Any:
        """``params[name]`` coerced to the type of ``default`` (``default`` when absent)."""
        if name not in self.params:
            return default
        value = self.params[name]
        if isinstance(default, bool):
            return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")
        return value if default is None else type(default)(value)

    # logging helpers, so user code can take ``ctx`` alone
    def log(self, step: int | None = None, **metrics: float) -> None:
        log(step, **metrics)

    def set_digest(self, kind: str, value: str, *, epoch: int | None = None) -> None:
        set_digest(kind, value, epoch=epoch)


STEP_TIMES_FILE = "step_times.f64"  # next to the event file: the run's step times, float64


class _ActiveRun:
    def __init__(self, writer: EventWriter, ctx: RunContext, step_times_path: str) -> None:
        self.writer = writer
        self.ctx = ctx
        self.lock = threading.Lock()
        self.last: dict[str, float] = {}
        self.step_times = StepTimes(step_times_path)  # bounded memory; exact summary at the end
        self.last_step: int | None = None
        self.last_log_t: float | None = None
        self.digests: dict[str, Any] = {}


_run: _ActiveRun | None = None
_warned = False


def _notice() -> None:
    global _warned
    if not _warned:
        _warned = True
        print("steady.sdk: not inside a Steady run; log() and set_digest() calls are ignored", file=sys.stderr)


def _start(ctx: RunContext, events_path: str | None = None) -> _ActiveRun:
    """Called by the harness only."""
    global _run
    path = events_path or os.environ[EVENTS_ENV]
    step_times_path = os.path.join(os.path.dirname(os.path.abspath(path)), STEP_TIMES_FILE)
    if os.path.exists(step_times_path):
        os.remove(step_times_path)
    _run = _ActiveRun(EventWriter(path), ctx, step_times_path)
    return _run


_exposed: set[str] = set()


def _expose(source: str) -> None:
    """Record that the run's code asked for ``source``'s seed (stored with the run as ``sources_exposed``)."""
    if source in _exposed:
        return
    _exposed.add(source)
    emit({"e": "info", "value": {"sources_exposed": sorted(_exposed)}})


def _active() -> _ActiveRun | None:
    return _run


def emit(event: dict[str, Any]) -> None:
    if _run is None:
        return
    _run.writer.write(event)


def context() -> RunContext | None:
    """The current run's context, or None outside a Steady run."""
    return _run.ctx if _run else None


def params() -> dict[str, Any]:
    return dict(_run.ctx.params) if _run else {}


FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")  # = steady.worker.contract.protocol.FLOAT_DTYPES


def float_dtype(value: Any) -> str:
    """The float type a logged value carries: numpy / torch / TensorFlow scalars and 0-d
    tensors name theirs (``float32``, ``torch.bfloat16`` …); Python numbers are float64."""
    dtype = getattr(value, "dtype", None)
    name = str(getattr(dtype, "name", dtype) or "float64").rsplit(".", 1)[-1]
    return name if name in FLOAT_DTYPES else "float64"


def _to_float(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def log(step: int | None = None, **metrics: Any) -> None:
    """Record metric values at ``step`` (default: previous step + 1). Values may be NaN/Inf."""
    run = _run
    if run is None:
        _notice()
        return
    now = time.perf_counter()
    values: dict[str, float] = {}
    dtypes: dict[str, str] = {}
    for k, v in metrics.items():
        cls = type(v)
        if cls is float or cls is int:  # the common case, without the dtype probing below
            values[k] = float(v)
        elif v is not None:
            values[k] = _to_float(v)
            if (t := float_dtype(v)) != "float64":
                dtypes[k] = t
    with run.lock:
        if step is None:
            step = 0 if run.last_step is None else run.last_step + 1
        step = int(step)
        new_step = step != run.last_step
        if new_step and STEP_TIME_KEY not in values and run.last_log_t is not None:
            values[STEP_TIME_KEY] = now - run.last_log_t
        if new_step:
            run.last_log_t = now
            run.last_step = step
        if STEP_TIME_KEY in values:
            run.step_times.add(values[STEP_TIME_KEY])
        run.last.update(values)
    if values:
        run.writer.write({"e": "m", "s": step, "v": values, **({"t": dtypes} if dtypes else {})})


def set_digest(kind: str, value: str, *, epoch: int | None = None) -> None:
    """Record a digest: ``initial_weights``, ``final_weights``, ``optimizer_state`` or
    ``data_order`` (one per epoch; ``epoch`` defaults to the next one)."""
    if kind not in DIGEST_KINDS:
        raise ValueError(f"unknown digest kind {kind!r}; expected one of {DIGEST_KINDS}")
    run = _run
    if run is None:
        _notice()
        return
    if kind == "data_order":
        orders = run.digests.setdefault("data_order", {})
        epoch = len(orders) if epoch is None else int(epoch)
        orders[epoch] = value
    else:
        run.digests[kind] = value
    run.writer.write({"e": "digest", "kind": kind, "value": value, "epoch": epoch})


def log_data_order(indices: Any, *, epoch: int | None = None) -> str:
    """Digest the sample indices actually fed in one epoch and record it."""
    digest = order_digest(indices)
    set_digest("data_order", digest, epoch=epoch)
    return digest


def digest_model(model: Any) -> str:
    """Digest a model's weights: a torch ``nn.Module`` or state dict, a Keras model, or a
    mapping name -> NumPy array. Works outside a run too."""
    mod = type(model).__module__
    if mod.startswith("torch") or hasattr(model, "state_dict"):
        from steady.worker.inrun.frameworks.torch import module_digest

        return module_digest(model)
    if mod.startswith(("keras", "tensorflow", "tf_keras")) or hasattr(model, "get_weights"):
        from steady.worker.inrun.frameworks.tensorflow import model_digest

        return model_digest(model)
    return state_digest(dict(model))


def digest_optimizer(optimizer: Any) -> str:
    mod = type(optimizer).__module__
    if mod.startswith("torch"):
        from steady.worker.inrun.frameworks.torch import optimizer_digest

        return optimizer_digest(optimizer)
    from steady.worker.inrun.frameworks.tensorflow import optimizer_digest as tf_optimizer_digest

    return tf_optimizer_digest(optimizer)


def digest_file(path: str) -> str:
    return file_digest(path)


def _summary() -> tuple[dict[str, float], dict[str, float]]:
    """Final metrics (last value of every key but step_time) and step-time statistics
    (:meth:`steady.worker.inrun.steptimes.StepTimes.summary`: exact median, correctly rounded sum)."""
    run = _run
    if run is None:
        return {}, {}
    final = {k: v for k, v in run.last.items() if k != STEP_TIME_KEY}
    return final, run.step_times.summary()
