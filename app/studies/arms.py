"""What the arms of a study differ by, as the report names it ("params.lr (0.1 vs 0.2)").

Reads the stored spec (a dict), so old studies (``stacks`` only) read as arms that differ by stack.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value
    return out


def effective_arms(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Arm name → what its runs get (stack, params, config, code); stacks read as arms. An arm
    without code runs the study's (None when the study ships none)."""
    base = dict((spec.get("workload") or {}).get("params") or {})
    study_code = spec.get("code")
    if spec.get("arms"):
        return {
            a["name"]: {
                "stack": a.get("stack"),
                "params": {**base, **(a.get("params") or {})},
                "config": a.get("config"),
                "code": a.get("code") or study_code,
            }
            for a in spec["arms"]
        }
    return {s["name"]: {"stack": s, "params": base, "config": None, "code": study_code}
            for s in spec.get("stacks") or []}


def _stack_label(stack: dict[str, Any] | None) -> str:
    if not stack:
        return "any"
    labels = ",".join(stack.get("labels") or [])
    return f"{stack['name']}[{labels}]" if labels else stack["name"]


def _config_label(config: dict[str, Any] | None) -> str:
    if not config:
        return "none"
    return f"{config['name']} sha256:{hashlib.sha256(config['content'].encode()).hexdigest()[:8]}"


def _code_key(code: dict[str, Any] | str | None) -> str | None:
    """What makes two arms' code the same: the archive's digest (a string: a label of an older study)."""
    return code.get("sha256") if isinstance(code, dict) else code


def _code_label(code: dict[str, Any] | str | None) -> str:
    if code is None:
        return "unset"
    if isinstance(code, str):
        return code
    git = code.get("git_commit")
    extra = f" (git {git[:10]}{', dirty' if code.get('dirty') else ''})" if git else ""
    return f"sha256:{code['sha256'][:12]}…{extra}"


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs from arm ``a`` to arm ``b``, one phrase each, in a stable order."""
    out = []
    if _stack_label(a["stack"]) != _stack_label(b["stack"]):
        out.append(f"stack ({_stack_label(a['stack'])} vs {_stack_label(b['stack'])})")
    pa, pb = _flat("params", a["params"], {}), _flat("params", b["params"], {})
    missing = object()
    for key in sorted(set(pa) | set(pb)):
        va, vb = pa.get(key, missing), pb.get(key, missing)
        if va != vb:
            sa = "unset" if va is missing else _short(va)
            sb = "unset" if vb is missing else _short(vb)
            out.append(f"{key} ({sa} vs {sb})")
    if _config_label(a["config"]) != _config_label(b["config"]):
        out.append(f"config ({_config_label(a['config'])} vs {_config_label(b['config'])})")
    if _code_key(a["code"]) != _code_key(b["code"]):
        out.append(f"code ({_code_label(a['code'])} vs {_code_label(b['code'])})")
    return out


def arm_differences(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every arm against the reference arm (``reference_stack``, else the first): what differs."""
    arms = effective_arms(spec)
    if len(arms) < 2:
        return []
    ref = spec.get("reference_stack") or next(iter(arms))
    if ref not in arms:
        return []
    return [
        {"reference": ref, "candidate": name, "differ_by": differences(arms[ref], arm)}
        for name, arm in arms.items()
        if name != ref
    ]


def differ_by_phrase(differ_by: list[str]) -> str:
    return "arms differ by: " + ("; ".join(differ_by) if differ_by else "nothing recorded")
