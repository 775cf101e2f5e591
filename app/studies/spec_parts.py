"""The parts of a study spec that say what its runs execute and where: the workload, its code,
the stacks and the arms (``steady.server.studies.schemas.StudySpec`` puts them together)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from steady.server.stats.sources import SD_MARGIN
from steady.worker.contract.distributed import TorchrunError, torchrun_launch
from steady.worker.contract.placeholders import placeholder_names
from steady.worker.contract.protocol import (
    BUILTIN_WORKLOADS,
    COMMAND_PLACEHOLDERS,
    CaptureSpec,
    DistributedSpec,
    Framework,
    Label,
)
from steady.server.kit.bounds import check_nesting
from steady.worker.contract.sources import CROSSED_PARAM, SOURCES, SOURCES_PARAM

MAX_PARAMS_BYTES = 64 * 1024  # workload.params travel with every lease of the study's runs

StackName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:+\-]+$")]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _at(field: str, value: Any, message: str) -> ValidationError:
    """A validation error at ``field`` of the model being checked (a model validator's own error would
    name only the model), so the 422 names e.g. ``workload.framework``."""
    return ValidationError.from_exception_data(
        "WorkloadSpec", [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(field,), input=value)]
    )


class WorkloadSpec(_Spec):
    framework: Framework = Field(
        description="what the code trains with: torch, tensorflow, or python (your command or entrypoint uses no ML "
        "framework: plain Python, NumPy, scikit-learn; its runs import neither torch nor TensorFlow)"
    )
    name: str | None = Field(None, description="a built-in workload: " + ", ".join(sorted(BUILTIN_WORKLOADS)))
    entrypoint: Annotated[str, Field(min_length=1, max_length=500)] | None = Field(
        None, description="user code: 'package.module:function' or 'path/to/script.py'"
    )
    command: Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]], Field(min_length=1, max_length=200)] | None = Field(
        None, description="user code as a command run in the code's directory, e.g. ['python', 'train.py', '--seed', "
        "'{seed}']; placeholders: " + ", ".join("{" + p + "}" for p in COMMAND_PLACEHOLDERS),
    )
    params: dict[str, Any] = Field({}, description=f"passed to the workload; at most {MAX_PARAMS_BYTES} bytes as JSON")
    capture: CaptureSpec | None = Field(
        None, description="metrics captured without the SDK: TensorBoard scalars under the run's directory and "
        "stdout/stderr lines matched by regexes with a named group 'step' or read by a preset (keras, hf, "
        "lightning, tqdm); default for a command: both, with the patterns 'step N ... loss X' and tqdm's "
        "'N/T [..., loss=X]'",
    )
    distributed: DistributedSpec | None = Field(
        None, description="train each run with `nproc` local processes (2 to 8), as `torchrun --standalone "
        "--nproc-per-node nproc` would: the worker sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
        "(a free port) for each, owns them as one run, captures rank 0 and records every rank's state digests; "
        "world size and backend are part of the run's stack fingerprint. A command that starts with "
        "`torchrun --nproc-per-node N` is run the same way",
    )

    @field_validator("params")
    @classmethod
    def _params_depth(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_nesting(value, "params")  # before anything serializes them (their size is checked below)
        return value

    @field_validator("command")
    @classmethod
    def _placeholders(cls, value: list[str] | None) -> list[str] | None:
        for i, arg in enumerate(value or [], start=1):
            placeholder_names(arg, i)  # a PlaceholderError is a ValueError: a 422 naming the argument and its place
        return value

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        size = len(json.dumps(self.params, separators=(",", ":"), default=str))
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params take {size} bytes as JSON; the limit is {MAX_PARAMS_BYTES}: "
                             "ship large inputs as files with your code, not as parameters")
        if sum(x is not None for x in (self.name, self.entrypoint, self.command)) != 1:
            raise ValueError("give exactly one of 'name' (a built-in workload), 'entrypoint' or 'command' (your code)")
        if self.name is not None:
            framework = BUILTIN_WORKLOADS.get(self.name)
            if framework is None:
                raise ValueError(
                    f"unknown built-in workload {self.name!r}; known: {', '.join(sorted(BUILTIN_WORKLOADS))}"
                )
            if framework != self.framework.value:
                # named at workload.framework: the framework is what the user got wrong for a built-in
                why = ("'python' is for your own code (a command or an entrypoint) that uses no ML framework"
                       if self.framework is Framework.python else f"not {self.framework.value}")
                raise _at("framework", self.framework.value,
                          f"built-in workload {self.name!r} runs on {framework}, {why}: give framework {framework!r}")
        if self.entrypoint is not None and ":" not in self.entrypoint and not self.entrypoint.endswith(".py"):
            raise ValueError("entrypoint must be 'package.module:function' or a path ending in .py")
        if self.command is not None:
            try:
                launch = torchrun_launch(self.command)
            except TorchrunError as exc:
                raise _at("command", self.command, str(exc)) from None
            if launch is not None and self.distributed is not None:
                raise _at("distributed", self.distributed.model_dump(), "the command starts with torchrun, which "
                          "already says how many processes: give either torchrun's --nproc-per-node or "
                          "'distributed', not both")
        return self


class CodeRef(_Spec):
    """The study's (or an arm's) code: an archive uploaded with PUT /api/v1/code/{sha256} (``steady submit``
    does this)."""

    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    git_commit: Annotated[str, Field(pattern=r"^[0-9a-f]{7,64}$")] | None = None
    dirty: bool = False
    workdir: Annotated[str, Field(max_length=500)] = Field(
        ".", description="the run's working directory inside the archive (the spec's folder), relative"
    )

    @field_validator("workdir")
    @classmethod
    def _relative(cls, value: str) -> str:
        import posixpath

        norm = posixpath.normpath(value or ".")
        if norm == ".." or norm.startswith(("../", "/", "\\")):
            raise ValueError("workdir must stay inside the archive")
        return norm


def _exact_version(value: str) -> str:
    """An exact PEP 440 version (``2.0.2``, ``2.1.0rc1``, ``2.1.0+cpu``): no specifier, no wildcard."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not an exact PEP 440 version (e.g. 2.0.2; no specifier or wildcard)") from None
    return value


PackageName = Annotated[str, Field(min_length=1, max_length=100,
                                   pattern=r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._\-]*[A-Za-z0-9])$")]
ExactVersion = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^\S+$"), AfterValidator(_exact_version)]


def _distinct_packages(value: dict[str, str]) -> dict[str, str]:
    from packaging.utils import canonicalize_name

    seen: dict[str, str] = {}
    for name in value:
        other = seen.setdefault(canonicalize_name(name), name)
        if other != name:
            raise ValueError(f"{other!r} and {name!r} name the same package")
    return value


class StackSpec(_Spec):
    name: StackName
    labels: Annotated[list[Label], Field(max_length=64)] = Field(
        [], description="a worker runs this stack's runs only if it has all these labels"
    )
    packages: Annotated[dict[PackageName, ExactVersion], Field(max_length=32),
                        AfterValidator(_distinct_packages)] = Field(
        {}, description="packages pinned to exact versions: the worker runs this stack's runs in a cached environment "
        "with these versions installed (pip install --no-deps from the package index the worker's pip is configured "
        "with), over its own packages; a run whose environment cannot be built fails (kind environment)"
    )

    @model_serializer(mode="wrap")
    def _without_empty_packages(self, handler: Any) -> Any:
        """A stack that pins nothing is stored as before pins existed: ``{name, labels}``."""
        out = handler(self)
        if isinstance(out, dict) and not out.get("packages"):
            out.pop("packages", None)
        return out


def _not_dots(name: str) -> str:
    """``.`` and ``..`` match the pattern but name the config folder or the run directory, not a file:
    every run of the arm would fail writing it."""
    if set(name) == {"."}:
        raise ValueError(f"a config file name may not be {name!r}: it must name a file")
    return name


ConfigFileName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$"),
                           AfterValidator(_not_dots)]
MAX_CONFIG_BYTES = 64 * 1024  # a config file travels with every lease of its arm's runs


class ConfigFileSpec(_Spec):
    """A named config file given to an arm's runs: the worker writes it into the run's directory and
    sets STEADY_CONFIG_FILE to its path (the workload also gets the path as params['config_file'])."""

    name: ConfigFileName
    content: Annotated[str, Field(max_length=MAX_CONFIG_BYTES)]


class ArmSpec(_Spec):
    """One arm of a comparison: it may override the stack, workload parameters, a config file or the
    code (its own archive, which its runs execute). Arms are compared by the stack-portability statistics, the first (or
    ``reference_stack``) being the reference."""

    name: StackName
    stack: StackSpec | None = Field(None, description="where this arm runs (its labels select workers)")
    params: dict[str, Any] = Field({}, description="overrides of workload.params (key by key)")
    config: ConfigFileSpec | None = None
    distributed: DistributedSpec | None = Field(
        None, description="this arm's runs use other processes than workload.distributed (e.g. another world size): "
        "compared with the other arms as a change of stack")
    code: CodeRef | Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        None, description="the code this arm's runs execute instead of the study's: an uploaded archive "
        "{sha256: ...} (`steady submit` packs and uploads `code: DIR`). A plain string is a label kept only "
        "by studies created before arms ran their own code; new studies refuse it",
    )

    @field_validator("params")
    @classmethod
    def _params_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_nesting(value, "params")
        size = len(json.dumps(value, separators=(",", ":"), default=str))
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params take {size} bytes as JSON; the limit is {MAX_PARAMS_BYTES}")
        return value

    def effective(self, workload: WorkloadSpec | None) -> dict[str, Any]:
        """What a run of this arm gets, as compared between arms."""
        base = dict(workload.params) if workload is not None else {}
        return {
            "stack": self.stack.model_dump(mode="json") if self.stack is not None else None,
            "params": {**base, **self.params},
            "config": self.config.model_dump(mode="json") if self.config is not None else None,
            "code": self.code.model_dump(mode="json") if isinstance(self.code, CodeRef) else self.code,
            "distributed": self.distributed.model_dump(mode="json") if self.distributed is not None else (
                workload.distributed.model_dump(mode="json") if workload is not None and workload.distributed else None),
        }


SourceName = Literal["init", "data", "dropout", "numerics", "ulp"]
CROSSED_ARM = "init_x_data"


class SourcesSpec(_Spec):
    """A sources study: which source of variance each arm varies (steady.worker.contract.sources)."""

    vary: Annotated[list[SourceName], Field(min_length=2, max_length=len(SOURCES))] = Field(
        ["init", "data", "dropout", "numerics", "ulp"], description="one arm per source, with only that source varied; plus 'none' (the "
        "unperturbed twin, everything pinned) and 'all' (every listed source varied)")
    crossed: Annotated[int, Field(ge=2, le=1000)] | None = Field(
        None, description="add an init × data arm: a run's init seed follows seed // crossed, its data seed "
        "seed % crossed (seeds 0..crossed²−1 give a crossed² grid); variance components with intervals")
    margin: Annotated[float, Field(gt=1, le=10, allow_inf_nan=False)] = Field(
        SD_MARGIN, description="a source is 'the full variance' when its SD is within [1/margin, margin] × "
        "the all-sources SD (TOST at the study's alpha, 5% unless set)")

    @field_validator("vary")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("sources must be distinct")
        return value

    def arms(self) -> list[dict[str, Any]]:
        """The arms this study runs, as ``arms`` entries of the spec."""
        out: list[dict[str, Any]] = [{"name": "none", "params": {SOURCES_PARAM: "none"}}]
        out += [{"name": s, "params": {SOURCES_PARAM: s}} for s in self.vary]
        out.append({"name": "all", "params": {SOURCES_PARAM: ",".join(self.vary)}})
        if self.crossed:
            out.append({"name": CROSSED_ARM, "params": {SOURCES_PARAM: "init,data", CROSSED_PARAM: self.crossed}})
        return out
