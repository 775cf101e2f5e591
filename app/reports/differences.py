"""What differs between two studies, named as a user would change it: a command's argument
("``--lr``: 0.05 → 0.1"), a parameter, a config file, a file of the code, the workload, the determinism
levels, the settings that shape a run, and the stack the runs reported (their fingerprints).

``steady compare`` lists these next to its verdicts and attributes a difference in results to them:
a difference in anything but the stack is the studies' own doing, never ``numerics``. Pure: specs,
fingerprints and per-file digests in, a list of :class:`Difference` out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


__all__ = ["CodeFiles", "Difference", "StudySide", "differences", "is_spec_text", "setup_differences",
           "stack_differences"]

UNSET = "unset"
STACK = "stack"
# Spec fields that shape what a run computes (the rest names, describes or schedules the study).
SETTINGS = ("seeds", "repeats", "threads")
# Fingerprint fields that say nothing about the stack: the determinism environment follows the level
# (compared as such) and PYTHONHASHSEED the seed.
FINGERPRINT_SKIP = ("env",)


@dataclass(frozen=True)
class Difference:
    """One thing that differs: ``kind`` (workload, command, params, config, code, spec_file, determinism,
    settings, stack), the ``name`` a user knows it by, and its value in each study (None: unset)."""

    kind: str
    name: str
    baseline: str | None
    candidate: str | None

    @property
    def note(self) -> str:
        a, b = self.baseline or UNSET, self.candidate or UNSET
        if self.kind == "code":
            return f"code {self.name}: {a} → {b}"
        if self.kind == "spec_file":
            return f"spec file {self.name} {_changed(self.baseline, self.candidate)} (its settings are compared above)"
        if self.kind == STACK:
            return f"stack {self.name}: {a} → {b}"
        return f"{self.name}: {a} → {b}"


def _changed(a: str | None, b: str | None) -> str:
    return "added" if a is None else "removed" if b is None else "changed"


@dataclass(frozen=True)
class CodeFiles:
    """A study's code: its archive digest, and each file's digest when the archive could be read
    (``problem`` says why not); ``specs``: its files that are study specs, not code a run executes."""

    sha256: str
    files: Mapping[str, str] | None = None
    specs: frozenset[str] = frozenset()
    problem: str | None = None


@dataclass(frozen=True)
class StudySide:
    spec: Mapping[str, Any]
    fingerprints: Sequence[Mapping[str, Any]] = ()
    code: CodeFiles | None = None  # None: the study ships no code (a built-in workload)
    arm_code: Mapping[str, CodeFiles] = field(default_factory=dict)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def _diff_maps(kind: str, prefix: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    fa: dict[str, Any] = {}
    fb: dict[str, Any] = {}
    for src, dst in ((a, fa), (b, fb)):
        for k, v in src.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, dst)
    missing = object()
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, missing), fb.get(key, missing)
        if va != vb:
            out.append(Difference(kind, key, None if va is missing else _text(va), None if vb is missing else _text(vb)))
    return out


# --------------------------------------------------------------------------- command


def _is_option(token: str) -> bool:
    if not token.startswith("-") or token == "-" or token == "--":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value


def argv_parts(argv: Sequence[str]) -> tuple[list[str], dict[str, str | None]]:
    """(positional arguments, options): ``--lr 0.1`` and ``--lr=0.1`` give ``{"--lr": "0.1"}``, a flag
    followed by another option or nothing gives None; an option given twice keeps both values."""
    positional: list[str] = []
    options: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if _is_option(token):
            name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
            val: str | None = value if eq else None
            if not eq and i + 1 < len(argv) and not _is_option(argv[i + 1]):
                val = argv[i + 1]
                i += 1
            if name in options and options[name] is not None and val is not None:
                val = f"{options[name]} {val}"
            options[name] = val
        else:
            positional.append(token)
        i += 1
    return positional, options


FLAG = "(flag)"


def command_differences(a: Sequence[str], b: Sequence[str]) -> list[Difference]:
    """Token by token: each option whose value changed, appeared or went, and each positional
    argument (the program, the script) that changed."""
    pa, oa = argv_parts(a)
    pb, ob = argv_parts(b)
    out = []
    for i in range(max(len(pa), len(pb))):
        va, vb = (pa[i] if i < len(pa) else None), (pb[i] if i < len(pb) else None)
        if va != vb:
            out.append(Difference("command", f"argument {i + 1}", va, vb))
    for name in [*oa, *(n for n in ob if n not in oa)]:
        if name not in oa or name not in ob or oa[name] != ob[name]:
            out.append(Difference("command", name,
                                  None if name not in oa else (oa[name] if oa[name] is not None else FLAG),
                                  None if name not in ob else (ob[name] if ob[name] is not None else FLAG)))
    return out


# --------------------------------------------------------------------------- the parts


def _workload_kind(w: Mapping[str, Any]) -> tuple[str, str | None]:
    for kind in ("name", "entrypoint", "command"):
        if w.get(kind) is not None:
            return kind, _text(w[kind]) if kind != "command" else None
    return "none", None


def _workload_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    out = []
    if a.get("framework") != b.get("framework"):
        out.append(Difference("workload", "framework", a.get("framework"), b.get("framework")))
    (ka, va), (kb, vb) = _workload_kind(a), _workload_kind(b)
    labels = {"name": "built-in workload", "entrypoint": "entrypoint", "command": "command", "none": "no workload"}
    if ka != kb:
        out.append(Difference("workload", "workload", f"{labels[ka]} {va or ''}".strip(),
                              f"{labels[kb]} {vb or ''}".strip()))
    elif ka == "command":
        out += command_differences([str(t) for t in a["command"]], [str(t) for t in b["command"]])
    elif va != vb:
        out.append(Difference("workload", labels[ka], va, vb))
    if (a.get("capture") or None) != (b.get("capture") or None):
        out += _diff_maps("workload", "capture", a.get("capture") or {}, b.get("capture") or {})
    return out


def _code_differences(a: CodeFiles | None, b: CodeFiles | None) -> list[Difference]:
    """File by file when both archives were read; a spec file that changed is named as such (its
    settings are compared as settings), never as a change of the code."""
    if a is None and b is None:
        return []
    if a is None or b is None:
        return [Difference("code", "archive", None if a is None else f"sha256:{a.sha256[:12]}",
                           None if b is None else f"sha256:{b.sha256[:12]}")]
    if a.sha256 == b.sha256:
        return []
    if a.files is None or b.files is None:
        why = a.problem or b.problem or "not readable"
        return [Difference("code", f"archive (files not compared: {why})", f"sha256:{a.sha256[:12]}",
                           f"sha256:{b.sha256[:12]}")]
    out = []
    for name in sorted(set(a.files) | set(b.files)):
        da, db = a.files.get(name), b.files.get(name)
        if da == db:
            continue
        spec = name in a.specs or name in b.specs
        out.append(Difference("spec_file" if spec else "code", name, da and f"sha256:{da[:12]}",
                              db and f"sha256:{db[:12]}"))
    return out


def _arms(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Arm name → its own overrides (params, config): the workload's params are compared once, as such."""
    return {a["name"]: dict(a) for a in spec["arms"]} if spec.get("arms") else None


def _arm_differences(a: Mapping[str, Any], b: Mapping[str, Any], side_a: StudySide,
                     side_b: StudySide) -> list[Difference]:
    arms_a, arms_b = _arms(a), _arms(b)
    if arms_a is None and arms_b is None:
        return []
    out = []
    arms_a, arms_b = arms_a or {}, arms_b or {}
    for name in [*arms_a, *(n for n in arms_b if n not in arms_a)]:
        if name not in arms_a or name not in arms_b:
            out.append(Difference("params", f"arm {name}", "present" if name in arms_a else None,
                                  "present" if name in arms_b else None))
            continue
        x, y = arms_a[name], arms_b[name]
        out += _diff_maps("params", f"arms.{name}.params", x.get("params") or {}, y.get("params") or {})
        out += _config_differences(x.get("config"), y.get("config"), f"arms.{name}.config")
        ca, cb = side_a.arm_code.get(name), side_b.arm_code.get(name)
        out += [Difference(d.kind, f"arms.{name}: {d.name}", d.baseline, d.candidate)
                for d in _code_differences(ca, cb)]
    return out


def _config_differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, name: str) -> list[Difference]:
    def label(c: Mapping[str, Any] | None) -> str | None:
        if not c:
            return None
        return f"{c['name']} sha256:{hashlib.sha256(str(c['content']).encode()).hexdigest()[:12]}"

    la, lb = label(a), label(b)
    return [Difference("config", name, la, lb)] if la != lb else []


def _levels(spec: Mapping[str, Any]) -> str:
    return ", ".join(str(d) for d in spec.get("determinism") or [])


def _settings_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    out = []
    for key in SETTINGS:
        if a.get(key) != b.get(key):
            out.append(Difference("settings", key, None if a.get(key) is None else _text(a.get(key)),
                                  None if b.get(key) is None else _text(b.get(key))))
    return out


def stack_differences(a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]]) -> list[Difference]:
    """Each fingerprint field whose values differ between the two studies' runs (every value a side's
    runs reported, joined)."""
    def values(fps: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for fp in fps:
            flat = _flat("", {k: v for k, v in fp.items() if k not in FINGERPRINT_SKIP}, {})
            for k, v in flat.items():
                out.setdefault(k, set()).add(_text(v))
        return out

    va, vb = values(a), values(b)
    if not va or not vb:
        return []  # a side without fingerprints: nothing to compare, not a difference
    return [Difference(STACK, k, ", ".join(sorted(va[k])) if k in va else None,
                       ", ".join(sorted(vb[k])) if k in vb else None)
            for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]


def setup_differences(a: StudySide, b: StudySide) -> list[Difference]:
    """Everything the two studies set up differently (all but the stack)."""
    sa, sb = a.spec, b.spec
    out = _workload_differences(sa.get("workload") or {}, sb.get("workload") or {})
    out += _diff_maps("params", "params", (sa.get("workload") or {}).get("params") or {},
                      (sb.get("workload") or {}).get("params") or {})
    out += _arm_differences(sa, sb, a, b)
    out += _code_differences(a.code, b.code)
    if _levels(sa) != _levels(sb):
        out.append(Difference("determinism", "determinism levels", _levels(sa) or None, _levels(sb) or None))
    out += _settings_differences(sa, sb)
    return out


def differences(a: StudySide, b: StudySide) -> list[Difference]:
    """What differs from study ``a`` (the baseline) to study ``b``: its setup, then its stack."""
    return setup_differences(a, b) + stack_differences(a.fingerprints, b.fingerprints)


# What a file must be to be read as a study spec. A spec is a few kB and a few levels deep; a larger or
# deeper YAML/JSON file is code or data, never parsed (finding it costs one read of its bytes).
SPEC_MAX_BYTES = 64 * 1024
SPEC_MAX_DEPTH = 32


def _yaml_doc(data: bytes) -> Any:
    """The YAML document in ``data``, or None when it is not one or nests deeper than SPEC_MAX_DEPTH (the
    depth is counted on the parser's events first, which never recurse, so no document exhausts the stack)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when installed: ~10x faster
    depth = 0
    try:
        for event in yaml.parse(data, Loader=loader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > SPEC_MAX_DEPTH:
                    return None
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(data, Loader=loader)  # a safe loader: CSafeLoader or SafeLoader
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None


def is_spec_text(name: str, data: bytes) -> bool:
    """Whether a YAML or JSON file holds a study spec (a mapping with a ``workload``): changing it
    changes the study's settings, which are compared as such, not the code its runs execute. Bounded
    work: a file over SPEC_MAX_BYTES, without the word ``workload`` or nested deeper than SPEC_MAX_DEPTH
    is not a spec, and is not parsed past what tells so."""
    if len(data) > SPEC_MAX_BYTES or b"workload" not in data:
        return False
    if name.endswith(".json"):
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return False
    else:
        doc = _yaml_doc(data)
    return isinstance(doc, dict) and "workload" in doc
