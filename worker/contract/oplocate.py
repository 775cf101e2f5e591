"""Where two runs part: the first divergent step from per-step state digests, and the first divergent
op from two op traces of that step. Pure Python (no framework), so the agent, the in-process
controls and the tests share one judgment.

A trace is a list of op records (what :mod:`steady.worker.inrun.localize` writes), in call order::

    {"op": "aten::addmm", "module": "Net.hidden", "phase": "forward", "line": "train.py:42",
     "inputs": "<hash of the tensor inputs>", "output": "<hash of the outputs>", "args": "<non-tensor arguments>"}

Hashes are order-aware (a permutation or a swapped pair of values changes them). An op whose
outputs cannot be hashed (uninitialised memory: ``aten::empty``...) records ``output: ""`` and never
counts as a divergence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer")


STEP_DIGEST_KEY = "steady.step_digest"  # the series a study with `localize: steps` records (steady.worker.inrun.localize)


def recorded_divergence(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[int | None, int]:
    """(the first step whose recorded state digest differs, or None; the steps both recorded) from two runs'
    ``step -> digest`` series. A step only one of them recorded is a divergence when all common steps agree."""
    common = sorted(set(a) & set(b))
    first = next((k for k in common if a[k] != b[k]), None)
    if first is None and set(a) != set(b):
        first = min(set(a) ^ set(b))
    return first, len(common)


def first_divergent_step(a: Sequence[str], b: Sequence[str]) -> int | None:
    """The first optimizer step whose state digest differs (None: all the common steps agree).
    A run that stopped earlier than the other diverges at the first step only one of them has."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class OpDivergence:
    """The answer: the first op whose output differs, where it ran and why."""

    step: int
    op: str
    module: str
    phase: str
    line: str
    index: int  # position of the op in run A's trace of the step
    inputs_identical: bool
    cause: str  # "op": inputs identical, so the op itself; "outside": an input no traced op made
    aligned_by: str  # "ops" (identical op streams) or "modules" (the streams differ in shape)
    note: str = ""
    ops_compared: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        """One line for a report: ``first divergent op: `aten::mul` in `Net.noisy` (forward) at train.py:42, ...``."""
        where = f"`{self.module}`" if self.module else "no module"
        why = ("inputs identical → the op itself" if self.inputs_identical
               else "its inputs already differ, made by no traced op → they came from outside the framework's ops")
        text = f"first divergent op: `{self.op}` in {where} ({self.phase}) at {self.line or 'an unknown line'}, " \
               f"step {self.step}, {why}"
        if self.aligned_by == "modules":
            text += "; the op streams differ in shape, aligned at module boundaries"
        if self.note:
            text += f" ({self.note})"
        return text


def named_exactly(answer: OpDivergence | None, expected: tuple[str, str, str], *, step: int | None,
                  fire_step: int) -> bool:
    """Whether a diagnosis of a planted fault names it exactly: the expected (op, module, phase), with
    identical inputs (the op itself), at a step no earlier than the fault fires (the controls' rule)."""
    return (answer is not None and (answer.op, answer.module, answer.phase) == tuple(expected)
            and answer.inputs_identical and step is not None and step >= fire_step)


def _first_differing(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x["output"] and y["output"] and x["output"] != y["output"]:
            return i
    return None


def _segments(trace: list[dict[str, Any]]) -> list[tuple[tuple[str, str], list[int]]]:
    """Consecutive ops of one (module, phase), in order: the module-boundary view of a trace."""
    out: list[tuple[tuple[str, str], list[int]]] = []
    for i, rec in enumerate(trace):
        key = (rec.get("module") or "", rec.get("phase") or "")
        if out and out[-1][0] == key:
            out[-1][1].append(i)
        else:
            out.append((key, [i]))
    return out


def first_divergent_op(a: list[dict[str, Any]], b: list[dict[str, Any]], *, step: int) -> OpDivergence | None:
    """Align two traces of the same step and name the first op whose output differs.

    Identical op streams (same op names in the same order): op by op; the first op whose output
    hash differs is the answer, and its inputs say why (identical: the op itself; different: an
    input came from outside the traced ops, since every earlier op agreed). Streams that differ in
    shape (another kernel, a fused op): module by module; the first (module, phase) segment
    whose last output differs is the answer, its first differing op named from run A. None when
    every output agrees."""
    same_stream = len(a) == len(b) and all(x["op"] == y["op"] for x, y in zip(a, b))
    if same_stream:
        i = _first_differing(a, b)
        if i is None:
            return None
        x, y = a[i], b[i]
        same_in = x["inputs"] == y["inputs"]
        note = ""
        if same_in and x.get("args", "") != y.get("args", ""):
            note = f"a non-tensor argument differs: {x.get('args', '')[:80]} vs {y.get('args', '')[:80]}"
        return OpDivergence(step=step, op=x["op"], module=x.get("module") or "", phase=x.get("phase") or "",
                            line=x.get("line") or "", index=i, inputs_identical=same_in,
                            cause="op" if same_in else "outside", aligned_by="ops", note=note, ops_compared=i + 1)
    sa, sb = _segments(a), _segments(b)
    parted = next((j for j, (x, y) in enumerate(zip(a, b)) if x["op"] != y["op"]), min(len(a), len(b)))
    for (ka, ia), (kb, ib) in zip(sa, sb):
        if ka != kb:
            break
        xa, xb = [a[i] for i in ia], [b[i] for i in ib]
        last_a = next((r["output"] for r in reversed(xa) if r["output"]), "")
        last_b = next((r["output"] for r in reversed(xb) if r["output"]), "")
        if last_a == last_b:
            continue
        first_in = xa[0]["inputs"] == xb[0]["inputs"]
        inner = _first_differing(xa, xb) if len(xa) == len(xb) and all(
            p["op"] == q["op"] for p, q in zip(xa, xb)) else None
        rec = xa[inner] if inner is not None else xa[0]
        ops_a = ", ".join(dict.fromkeys(r["op"] for r in xa))[:160]
        ops_b = ", ".join(dict.fromkeys(r["op"] for r in xb))[:160]
        note = (f"the op streams part at op {parted}: `{a[parted]['op'] if parted < len(a) else 'end'}` vs "
                f"`{b[parted]['op'] if parted < len(b) else 'end'}`; this module ran {ops_a} vs {ops_b}")
        return OpDivergence(step=step, op=rec["op"], module=ka[0], phase=ka[1], line=rec.get("line") or "",
                            index=ia[0] if inner is None else ia[inner], inputs_identical=first_in,
                            cause="op" if first_in else "outside", aligned_by="modules", note=note,
                            ops_compared=ia[-1] + 1)
    if [k for k, _ in sa] == [k for k, _ in sb]:
        return None  # other kernels, the same outputs at every module boundary
    # the module sequence itself differs: the first op where the streams part is the best answer
    if parted >= len(a):
        return None if len(a) == len(b) else OpDivergence(
            step=step, op="(end of trace)", module="", phase="", line="", index=parted, inputs_identical=False,
            cause="outside", aligned_by="modules", note="one trace is longer than the other")
    x = a[parted]
    return OpDivergence(step=step, op=x["op"], module=x.get("module") or "", phase=x.get("phase") or "",
                        line=x.get("line") or "", index=parted, inputs_identical=False, cause="outside",
                        aligned_by="modules",
                        note=f"the op streams and their modules part at op {parted}: `{x['op']}` vs "
                             f"`{b[parted]['op'] if parted < len(b) else 'end'}`")
