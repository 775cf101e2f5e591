"""The wire contract between the Steady server and its workers.

This module is the single source of truth for lease, heartbeat, metric batch and result
messages. It depends on pydantic (and pybase64) only: the server imports it (``app -> steady.worker.contract.protocol``),
the worker never imports the server.

Floats travel exactly, as strict JSON: a finite value is a number, NaN and ±Inf are the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (``WireFloat``, the one spelling of the whole
API); ``null`` only ever means "absent". For one release the server still accepts the bare
``NaN`` / ``Infinity`` tokens that workers before this change wrote (not valid JSON).
For speed and bit-exactness a series may instead be *packed*:
``steps_b64`` is base64 of little-endian int64 and ``values_b64`` base64 of little-endian
float64 (``<i8`` / ``<f8``), which is what the worker sends.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from datetime import datetime
from enum import Enum, nonmember
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from steady.worker.contract.linear_re import PatternError, compile_linear

_pybase64_decode: Callable[..., bytes] | None
b64encode: Callable[[bytes], bytes]
try:  # SIMD base64 (a dependency): a 5,000-point batch's arrays decode ~15x faster than with binascii
    from pybase64 import b64decode as _pybase64_decode
    from pybase64 import b64encode
except ImportError:  # an install without it still speaks the protocol, the same strict way, slower
    _pybase64_decode = None
    from base64 import b64encode

PROTOCOL_VERSION = 1

# Limits shared by both sides; the server may be configured lower, never higher.
MAX_KEY_LENGTH = 200
MAX_NAME_LENGTH = 200
MAX_LABELS = 64
MAX_SERIES_PER_BATCH = 256
# Points in one metric batch: the server's default STEADY_MAX_BATCH_POINTS. A server configured
# lower answers 413 and the worker halves its batches.
MAX_BATCH_POINTS = 200_000
MAX_ERROR_LENGTH = 65_536

# Name of the series in which workers record the wall time of every training step (s).
STEP_TIME_KEY = "step_time"
# Step times the agent derives for a run that does not log them (steady.worker.agent.stepclock): from
# the arrival of its step lines on stdout, from its TensorBoard events' wall times. The report takes
# the first of STEP_TIME_KEYS that the compared runs have, and says which.
STEP_TIME_STDOUT_KEY = "step_time:stdout"
STEP_TIME_TENSORBOARD_KEY = "step_time:tensorboard"
STEP_TIME_KEYS = (STEP_TIME_KEY, STEP_TIME_TENSORBOARD_KEY, STEP_TIME_STDOUT_KEY)

# A client-chosen id of one logical request, reused by every retry of it: the server answers a
# repeated lease, complete, fail or release with the acknowledgement of the first one.
RequestId = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]


class ErrorCode(str, Enum):
    """Machine-readable ``code`` of a 409 answer to a worker."""

    lease_lost = "lease_lost"  # the run is no longer leased under this lease id
    already_finished = "already_finished"  # the run already completed, failed or was cancelled
    not_lease_holder = "not_lease_holder"  # another worker holds this run's lease


FloatDtype = Literal["float64", "float32", "float16", "bfloat16"]
MetricKey = Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH, pattern=r"^[A-Za-z0-9_.:/\-]+$")]
Label = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9_.:/+=\-]+$")]


# --- floats -----------------------------------------------------------------------------------

# JSON has no NaN or ±Inf. The API's one spelling of them (JavaScript's names, as MLflow and
# proto3 JSON write them): these strings, both ways; null is never a number, only "absent".
NONFINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def wire_float(value: float) -> float | str:
    """``value`` for JSON: a finite float as it is, NaN and ±Inf as ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"``."""
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _from_wire(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return NONFINITE[value]
        except KeyError:
            raise ValueError(f"a number, or one of 'NaN', 'Infinity', '-Infinity'; got the string {value[:40]!r}") from None
    return value


def _to_wire(value: Any) -> Any:
    return wire_float(value) if isinstance(value, float) else value


# A float field of the API: validates numbers and the three strings (no other string, and no
# null unless the field says ``WireFloat | None``); writes non-finite values as the strings in
# JSON (Python-mode dumps keep the float).
WireFloat = Annotated[
    float,
    BeforeValidator(_from_wire),
    PlainSerializer(_to_wire, when_used="json"),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string", "enum": list(NONFINITE)}],
                    "description": "a number; NaN and ±Inf as the strings 'NaN', 'Infinity', '-Infinity'"}),
]


class _Model(BaseModel):
    # non-finite floats in untyped fields (params, fingerprints) are written as the strings too
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


def _without_nul(value: Any) -> Any:
    """NUL characters replaced by U+FFFD, recursively: PostgreSQL text and jsonb cannot hold NUL,
    and a failure report must be stored whatever bytes a crashing run printed."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


class _FreeText(_Model):
    """A message whose strings come from user code or the host (errors, fingerprints)."""

    @model_validator(mode="before")
    @classmethod
    def _strip_nul(cls, data: Any) -> Any:
        return _without_nul(data)


class Framework(str, Enum):
    """What the run's code trains with. ``python``: code that uses no ML framework (plain Python,
    NumPy, scikit-learn); its runs import neither torch nor TensorFlow, so they cost no framework
    start-up and run on any worker. Only user code (``command``, ``entrypoint``) can be ``python``."""

    torch = "torch"
    tensorflow = "tensorflow"
    python = "python"


class Determinism(str, Enum):
    none = "none"
    seeded = "seeded"
    strict = "strict"


# Built-in workloads and the framework each runs on. The server validates study specs
# against this table; worker/inrun/workloads/ implements each name.
BUILTIN_WORKLOADS: dict[str, str] = {
    "torch_mlp": "torch",
    "fleet_canary": "torch",  # steady fleet check's canary (and its planted faults)
    "torch_cnn": "torch",
    "torch_dataloader_workers": "torch",
    "torch_nondeterministic_kernels": "torch",
    "hashseed_vocab": "torch",
    "torch_controls": "torch",
    "torch_sources": "torch",
    "numpy_sources": "python",  # torch_sources without the framework's start-up: NumPy only
    "torch_distributed": "torch",
    "keras_mlp": "tensorflow",
    "keras_controls": "tensorflow",
}


# Placeholders a command workload's arguments may use (steady.server.studies.schemas checks them).
COMMAND_PLACEHOLDERS = ("seed", "repeat", "determinism", "device", "run_dir", "threads", "checkpoint_dir",
                        # per-source seeds of a sources study (steady.worker.contract.sources)
                        "init_seed", "data_seed", "dropout_seed", "numerics_seed", "ulp_seed")


class RunStatus(str, Enum):
    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"

    # The status sets, as the values stored in ``runs.status`` (a member is equal to its value,
    # so ``status in RunStatus.TERMINAL`` holds for either; SQL takes them in ``.in_()``).
    ACTIVE = nonmember(frozenset({"queued", "running"}))  # waiting for a worker or on one
    TERMINAL = nonmember(frozenset({"completed", "failed", "cancelled"}))  # never changes again


class StudyStatus(str, Enum):
    """A study's status: derived from its runs' statuses (``steady.server.studies.service.refresh_status``);
    an external study (uploaded runs) stays ``open``."""

    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    open = "open"

    ACTIVE = nonmember(frozenset({"queued", "running"}))
    TERMINAL = nonmember(frozenset({"completed", "failed", "cancelled"}))
    # Ended by its runs, not by a user: judged once (outcome, alerts) when it gets there.
    JUDGED = nonmember(frozenset({"completed", "failed"}))


class FailureKind(str, Enum):
    error = "error"  # the training code raised or the process exited non-zero
    crash = "crash"  # killed by a signal
    timeout = "timeout"  # ran past its time limit
    cancelled = "cancelled"  # the study was cancelled
    environment = "environment"  # the stack's pinned packages could not be installed (steady.worker.contract.pkgenv)


# --- registration ---------------------------------------------------------------------------


class EngineJob(_Model):
    """Where a batch scheduler started this agent, so a run can be traced to the job's own logs.

    ``engine`` is ``slurm`` or ``kubernetes`` (``local`` when no scheduler is detected is not
    sent); ``job_id`` is what the engine's own tools take (``123_4`` for Slurm array task 4 of
    job 123, the pod name on Kubernetes); ``node`` the host it runs on.
    """

    engine: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9_\-]+$")]
    job_id: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
    node: Annotated[str, Field(max_length=MAX_NAME_LENGTH)] | None = None
    detail: Annotated[dict[str, Annotated[str, Field(max_length=MAX_NAME_LENGTH)]], Field(max_length=16)] = {}


class WorkerRegistration(_FreeText):
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
    labels: Annotated[list[Label], Field(max_length=MAX_LABELS)] = []
    fingerprint: dict[str, Any] = {}
    engine: EngineJob | None = None
    protocol_version: int = PROTOCOL_VERSION


class WorkerRegistered(_Model):
    worker_id: int
    name: str
    labels: list[str]
    lease_seconds: float
    heartbeat_seconds: float


# --- leasing --------------------------------------------------------------------------------


# Header of a 204 (nothing to lease) answer: runs in the request's scope (its study, or the
# whole queue) that are still running elsewhere and may come back to the queue if their
# lease expires. An agent started with --exit-when-idle stops once this is 0.
PENDING_HEADER = "X-Steady-Pending"


class LeaseRequest(_Model):
    worker_id: int
    study_id: int | None = None  # lease only runs of this study (agents launched for one study)
    request_id: RequestId | None = None
    # lease only runs of built-in workloads, never user code; None (left out): any run, so a
    # worker that does not ask for it still speaks to older servers, which forbid the field
    builtin_only: bool | None = None
    # ask for a run-scoped credential with the lease (Lease.run_token); a worker that does not
    # ask (older ones, whose Lease model forbids the field) gets a lease without it
    run_credential: bool | None = None


class ConfigFile(_Model):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
    content: str = Field(max_length=64 * 1024)


# step N ... loss X: "step 100 | loss 2.31", "Step 100: loss=2.31", "iter 100, loss: 2.31",
# "Epoch 3 step 100 loss 2.31e-1", captured as the metric ``loss`` (steady.worker.agent.capture).
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf)"
DEFAULT_CAPTURE_PATTERN = (r"(?i)\b(?:step|iter|iteration|it)\b\s*[:=#]?\s*(?P<step>\d+)\b"
                           r"[^\n]*?\bloss\b\s*[:=]?\s*(?P<loss>" + _NUMBER + r")")
# A tqdm bar's postfix: " 50%|#####     | 50/100 [00:01<00:01, 45.2it/s, loss=2.31]" or "50it [00:01, loss=2.31]",
# the bar's count as the step (the elapsed time after the bracket tells a bar from "12:00:00,123 [INFO]").
# No nested quantifiers, no lookaround: these patterns also run in a linear-time engine (RE2).
TQDM_CAPTURE_PATTERN = (r"(?P<step>\d+)(?:/\d+|it) \[\d+:\d\d[^\]\n]*?\bloss=(?P<loss>" + _NUMBER + r")")
DEFAULT_CAPTURE_PATTERNS = (DEFAULT_CAPTURE_PATTERN, TQDM_CAPTURE_PATTERN)
# Logging shapes a preset reads (steady.worker.agent.presets): Keras fit's epoch and progress lines, the
# Hugging Face Trainer's dict lines, PyTorch Lightning's progress bar, any tqdm bar's postfix, and the lines of
# pytorch/examples' mnist and word_language_model scripts.
CapturePreset = Literal["keras", "hf", "lightning", "tqdm", "mnist", "word_language_model"]


def check_capture_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot capture metrics, or None (used at submit and by the worker). Patterns run
    on the linear-time engine (:mod:`steady.worker.contract.linear_re`): one it cannot run is refused here."""
    try:
        rx = compile_linear(pattern)
    except PatternError as exc:
        if exc.unsupported:
            return f"not supported by the linear-time regex engine: {exc}"
        return f"not a valid regular expression: {exc}"
    if "step" not in rx.groupindex:
        return "needs a named group 'step', e.g. (?P<step>\\d+)"
    if len(set(rx.groupindex) - {"epoch"}) < 2:
        return "needs a named group per metric besides 'step' (and 'epoch'), e.g. (?P<loss>[-+.\\deE]+)"
    return None


def _capture_pattern(pattern: str) -> str:
    why = check_capture_pattern(pattern)
    if why:
        raise ValueError(f"pattern {pattern!r}: {why}")
    return pattern


class CaptureSpec(_Model):
    """What the worker captures from a run besides the SDK (steady.worker.agent.capture): scalars of
    TensorBoard event files written under the run's directory, and stdout/stderr lines matched
    by ``patterns`` (regexes with a named group ``step``, optionally ``epoch``, and one per metric) and by
    ``preset`` (a known logging shape: Keras ``fit``, the Hugging Face Trainer, Lightning, tqdm, pytorch/examples'
    mnist and word_language_model); neither given: the default
    ``step N ... loss X`` and tqdm ``N/T [..., loss=X]`` patterns)."""

    tensorboard: bool = True
    stdout: bool = True
    # each checked on its own, so a 422 names it: workload.capture.patterns[i]
    patterns: Annotated[list[Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_capture_pattern)]],
                        Field(max_length=32)] = []
    # a known logging shape read from the output instead of the default pattern (patterns still apply)
    preset: CapturePreset | None = None


MAX_RESUME_POINTS = 8


class ResumeSpec(_Model):
    """The resume check (steady.worker.inrun.resume): the run is trained once uninterrupted, and once killed
    after each step in ``at`` (optimizer steps done) and restarted through the code's own resume path
    (its checkpoints go to ``{checkpoint_dir}`` / ``ctx.checkpoint_dir``); the state at each resume point
    and the final values are compared. ``runs``: how many of the study's seeds (the first ones) get it."""

    at: Annotated[list[Annotated[int, Field(ge=1, le=10_000_000)]], Field(min_length=1, max_length=MAX_RESUME_POINTS)]
    runs: Annotated[int, Field(ge=1, le=100)] = 1
    # how the interrupted launch is stopped: SIGKILL (a preemption's end, an OOM kill), or SIGTERM (what a
    # scheduler sends first: the code's handler may run; SIGKILL after a grace if the process lives on)
    signal: Literal["kill", "term"] = "kill"
    # a stop between the micro-batches of one gradient-accumulation step: after this many backward passes
    # of the update after each step in ``at`` (torch); None: between updates
    micro_batches: Annotated[int, Field(ge=1, le=10_000)] | None = None

    @field_validator("at")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError(f"resume steps must be strictly increasing, got {value}")
        return value


MAX_DISTRIBUTED_PROCESSES = 8


class DistributedSpec(_Model):
    """A run trained by several local processes (steady.worker.inrun.distributed): the worker starts ``nproc``
    copies of the code with the environment ``torchrun`` sets (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free port of 127.0.0.1), owns them as one run and ends
    them together. Rank 0's output, metrics and digests are the run's; every rank's state digests are kept."""

    nproc: Annotated[int, Field(ge=2, le=MAX_DISTRIBUTED_PROCESSES)]
    backend: Literal["gloo", "nccl"] = "gloo"


class RunSpec(_Model):
    """Everything a worker needs to execute one run."""

    framework: Framework
    workload: str | None = None  # a built-in workload name
    entrypoint: str | None = None  # "package.module:function" or "path/to/script.py[:function]"
    command: list[str] | None = None  # argv with COMMAND_PLACEHOLDERS, run in the code's directory
    code_sha256: str | None = None  # the code archive this run executes: its arm's, else the study's (GET /api/v1/code/{sha256})
    code_workdir: str = "."  # the run's working directory inside the unpacked archive
    params: dict[str, Any] = {}
    seed: int
    repeat: int
    determinism: Determinism
    threads: int = 2
    time_limit_s: float = 600.0
    metrics: list[str] = []
    stack: str = "default"  # the run's group: a stack name, or the arm's name in a study with arms
    config_file: ConfigFile | None = None  # the arm's config file, written into the run's directory
    code: str | None = None  # the arm's own code digest (informational: code_sha256 is what runs)
    capture: CaptureSpec | None = None  # None: a command workload gets the default capture, others none
    localize_steps: bool = False  # record the training state's digest at every step (steady.step_digest)
    resume: ResumeSpec | None = None  # this run also gets the resume check
    distributed: DistributedSpec | None = None  # several local processes train this run (one per rank)
    packages: dict[str, str] = {}  # the stack's pinned packages: the run's environment has exactly these versions


class Lease(_Model):
    run_id: int
    study_id: int
    attempt: int
    lease_id: str
    lease_expires_at: datetime
    heartbeat_seconds: float
    spec: RunSpec
    # A credential for this run alone, valid while this lease is: the run subprocess gets it
    # (never the worker's token) for its own writes, e.g. the MLflow-compatible endpoint.
    run_token: str | None = None


class Heartbeat(_Model):
    lease_id: str
    step: int | None = None  # progress, if known


class HeartbeatAck(_Model):
    lease_expires_at: datetime
    cancel: bool = False


# --- metrics --------------------------------------------------------------------------------


FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")


def b64decode_strict(text: str) -> bytes:
    """Standard base64 with padding and nothing else (binascii.Error, a ValueError, otherwise)."""
    if _pybase64_decode is not None:
        return _pybase64_decode(text, validate=True)
    return binascii.a2b_base64(text, strict_mode=True)


_ENCODED_HERE = "steady.series_bytes"  # validation context of ``Series.from_bytes``


class Series(_Model):
    """One metric's points in a batch: either lists or packed little-endian arrays."""

    key: MetricKey
    steps: list[int] | None = None
    values: list[WireFloat] | None = None
    steps_b64: str | None = None
    values_b64: str | None = None
    # The type the values were logged in (values travel as float64 either way): ULPs between
    # repeats are counted in it. None: float64 (a Python float).
    dtype: FloatDtype | None = None
    # Values parsed from printed text (a run's stdout): the unit of their last printed digit (1e-4 for
    # "0.1234"), what they are precise to; their differences are counted in it, not in ULPs. None: binary floats.
    resolution: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    # The packed arrays' bytes, decoded once by the validation below (not part of the message).
    _packed_bytes: tuple[bytes, bytes] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_encoding(self, info: ValidationInfo) -> Series:
        lists = self.steps is not None or self.values is not None
        packed = self.steps_b64 is not None or self.values_b64 is not None
        if lists == packed:
            raise ValueError("give either steps and values, or steps_b64 and values_b64")
        if lists:
            if self.steps is None or self.values is None:
                raise ValueError("steps and values must both be given")
            if len(self.steps) != len(self.values):
                raise ValueError(f"steps has {len(self.steps)} items but values has {len(self.values)}")
        else:
            if self.steps_b64 is None or self.values_b64 is None:
                raise ValueError("steps_b64 and values_b64 must both be given")
            if self._packed_bytes is not None:  # an instance validated before (e.g. as a batch's field)
                return self
            encoded = (info.context or {}).get(_ENCODED_HERE)
            if encoded is not None:  # ``from_bytes``: the bytes this process just encoded, not decoded back
                steps, values = encoded
            else:
                try:
                    steps, values = b64decode_strict(self.steps_b64), b64decode_strict(self.values_b64)
                except ValueError as exc:
                    raise ValueError(f"invalid base64: {exc}") from None
            if len(steps) % 8 or len(values) % 8 or len(steps) != len(values):
                raise ValueError("packed steps and values must be int64/float64 arrays of equal length")
            self._packed_bytes = (steps, values)
        return self

    def packed_bytes(self) -> tuple[bytes, bytes]:
        """Little-endian int64 steps and float64 values of a packed series, as bytes."""
        if self._packed_bytes is None:
            self._packed_bytes = (base64.b64decode(self.steps_b64 or ""), base64.b64decode(self.values_b64 or ""))
        return self._packed_bytes

    def __len__(self) -> int:
        if self.steps is not None:
            return len(self.steps)
        return len(self.steps_b64 or "") * 3 // 4 // 8

    @classmethod
    def packed(cls, key: str, steps: list[int], values: list[float], dtype: str | None = None) -> Series:
        """Pack python lists without numpy (the SDK and agent may run without it)."""
        n = len(steps)
        return cls.from_bytes(key, struct.pack(f"<{n}q", *steps), struct.pack(f"<{n}d", *values), dtype)

    @classmethod
    def from_bytes(cls, key: str, steps: bytes, values: bytes, dtype: str | None = None,
                   resolution: float | None = None) -> Series:
        """A packed series from little-endian int64 steps and float64 values. Validated like any
        message, except that the base64 this builds is not decoded back to check it."""
        return cls.model_validate(
            {
                "key": key,
                "dtype": dtype if dtype in FLOAT_DTYPES and dtype != "float64" else None,
                "resolution": resolution,
                "steps_b64": b64encode(steps).decode("ascii"),
                "values_b64": b64encode(values).decode("ascii"),
            },
            context={_ENCODED_HERE: (bytes(steps), bytes(values))},
        )

    def unpacked(self) -> tuple[list[int], list[float]]:
        if self.steps is not None and self.values is not None:
            return list(self.steps), list(self.values)
        steps = base64.b64decode(self.steps_b64 or "")
        values = base64.b64decode(self.values_b64 or "")
        n = len(steps) // 8
        return list(struct.unpack(f"<{n}q", steps)), list(struct.unpack(f"<{n}d", values))


class MetricBatch(_Model):
    """A batch of points for one run. ``seq`` makes a re-sent batch idempotent."""

    lease_id: str
    seq: Annotated[int, Field(ge=0)]
    series: Annotated[list[Series], Field(min_length=1, max_length=MAX_SERIES_PER_BATCH)]

    @model_validator(mode="after")
    def _unique_keys(self) -> MetricBatch:
        seen: set[str] = set()
        for s in self.series:
            if s.key in seen:
                raise ValueError(f"metric key {s.key!r} appears twice in one batch; send each key once")
            seen.add(s.key)
        return self


class BatchAck(_Model):
    run_id: int
    seq: int
    points: int
    duplicate: bool = False


# --- results --------------------------------------------------------------------------------


class Digests(_Model):
    """SHA-256 hex digests recorded inside the training process."""

    initial_weights: str | None = None
    data_order: list[str] = []  # one per epoch
    final_weights: str | None = None
    optimizer_state: str | None = None
    resume: dict[str, Any] | None = None  # the resume check's record (steady.worker.inrun.resume), when it ran
    # a multi-process run's per-rank record (steady.worker.contract.distributed.summarize), when it had ranks
    distributed: dict[str, Any] | None = None


# A command's argv as the worker ran it (placeholders filled): kept with the run.
Argv = Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=1024)]
MAX_CONFLICTS_KEPT = 20  # conflicts a run keeps in full; the rest are counted
MAX_SOURCE_LENGTH = 300


class ValueOrigin(_FreeText):
    """One value logged for a (key, step), and where it came from: the channel (``sdk``, ``stdout``,
    ``tensorboard``) and the line or record (``line 512``, ``train/events.out.tfevents.1 record 17``)."""

    value: WireFloat
    source: Annotated[str, Field(max_length=MAX_SOURCE_LENGTH)]


class MetricConflict(_FreeText):
    """Two different values logged for one (key, step): the first is kept, the second is not stored."""

    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)]  # as logged, even a key refused
    step: int
    kept: ValueOrigin
    dropped: ValueOrigin


class MetricRestart(_FreeText):
    """The first time a key's step went back on a run's output (a restart: e.g. a new epoch printed without its
    number), at which output line, and a capture pattern naming the epoch that would keep every value."""

    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)]
    line: Annotated[int, Field(ge=1)]
    step_before: int
    step_after: int
    pattern: Annotated[str, Field(max_length=2000)] | None = None


class MetricConflicts(_FreeText):
    """A run's capture conflicts: the first :data:`MAX_CONFLICTS_KEPT` in full, and how many in all; ``restart``:
    the output's first step counter that went back (``restarts``: on how many lines one did)."""

    count: Annotated[int, Field(ge=0)]
    first: Annotated[list[MetricConflict], Field(max_length=MAX_CONFLICTS_KEPT)] = []
    restart: MetricRestart | None = None
    restarts: Annotated[int, Field(ge=0)] = 0


class RunResult(_FreeText):
    lease_id: str
    request_id: RequestId | None = None
    final_metrics: dict[str, WireFloat] = {}
    digests: Digests = Digests()
    fingerprint: dict[str, Any] = {}
    determinism_applied: dict[str, Any] = {}
    timings: dict[str, WireFloat] = {}  # wall_s, step_time_mean_s, ...
    stderr_tail: Annotated[str, Field(max_length=MAX_ERROR_LENGTH)] = ""  # the end of its stdout and stderr
    argv: Argv | None = None
    conflicts: MetricConflicts | None = None  # values logged twice, differently, for one (key, step)


class RunFailure(_FreeText):
    lease_id: str
    request_id: RequestId | None = None
    kind: FailureKind = FailureKind.error
    error: Annotated[str, Field(max_length=MAX_ERROR_LENGTH)]
    stderr_tail: Annotated[str, Field(max_length=MAX_ERROR_LENGTH)] = ""
    fingerprint: dict[str, Any] = {}
    determinism_applied: dict[str, Any] = {}
    argv: Argv | None = None
    conflicts: MetricConflicts | None = None


class RunRelease(_Model):
    """Give a leased run back to the queue (agent shutting down); the attempt is not counted."""

    lease_id: str
    request_id: RequestId | None = None


class RunAck(_Model):
    run_id: int
    status: RunStatus
    duplicate: bool = False  # true when this answers a repeat of an already applied request


# --- localization jobs ---------------------------------------------------------------------------
# A user asks the server (the run page's Localize button, POST /api/v1/studies/{id}/localization-jobs)
# to localize where two repeats part; a worker leases the job as it leases a run, replays the pair with
# the same driver as `steady localize` (``python -m steady.worker.agent.localize``) and posts the answer.

# On a lease answer without a run (204): localization jobs in the request's scope waiting for a worker.
LOCALIZATIONS_HEADER = "X-Steady-Localizations"


class LocalizationStatus(str, Enum):
    pending = "pending"  # waiting for a worker
    running = "running"  # leased: a worker replays the pair
    done = "done"  # the answer is kept in the study's report (localized, identical, or the replays failed)
    failed = "failed"  # no answer: the worker could not replay the pair (see error)
    cancelled = "cancelled"

    ACTIVE = nonmember(frozenset({"pending", "running"}))
    TERMINAL = nonmember(frozenset({"done", "failed", "cancelled"}))


class LocalizationLeaseRequest(_Model):
    request_id: RequestId | None = None
    study_id: int | None = None  # only this study's jobs (agents launched for one study)
    builtin_only: bool | None = None  # only jobs of built-in workloads, never user code


class LocalizationLease(_Model):
    job_id: int
    study_id: int
    run_ids: Annotated[list[int], Field(min_length=2, max_length=2)]
    attempt: int
    lease_id: str
    lease_expires_at: datetime
    heartbeat_seconds: float
    time_limit_s: float  # for the whole replay (both pairs); the server fails the job past it, plus grace
    step: int | None = None  # the first divergent step, when the runs recorded their step digests
    specs: Annotated[list[RunSpec], Field(min_length=2, max_length=2)]  # as the runs' leases gave them


class LocalizationHeartbeat(_Model):
    lease_id: str


class LocalizationHeartbeatAck(_Model):
    lease_expires_at: datetime
    cancel: bool = False


class LocalizationDone(_FreeText):
    """The replay driver's answer, as `steady localize` posts it (the server checks it as one)."""

    lease_id: str
    request_id: RequestId | None = None
    status: Literal["localized", "identical", "failed"]
    step: int | None = None
    replays: int = 0
    answer: dict[str, Any] | None = None
    sentence: Annotated[str, Field(min_length=1, max_length=4000)]


class LocalizationFailure(_FreeText):
    """No answer: the code could not be fetched, the driver crashed, ran past its limit or was cancelled."""

    lease_id: str
    request_id: RequestId | None = None
    kind: FailureKind = FailureKind.error
    error: Annotated[str, Field(min_length=1, max_length=4000)]


class LocalizationRelease(_Model):
    """Give a leased job back (the agent is shutting down); the attempt is not counted."""

    lease_id: str
    request_id: RequestId | None = None


class LocalizationAck(_Model):
    job_id: int
    status: LocalizationStatus
    duplicate: bool = False
