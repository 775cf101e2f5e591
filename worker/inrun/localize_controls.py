"""Planted single-op faults: does localization name the op, the module and the phase?

    python -m steady.worker.inrun.localize_controls            # the table in docs/controls.md
    python -m steady.worker.inrun.localize_controls --clean 50 --faults all

A small PyTorch training (an MLP with a custom index_add pooling layer, LayerNorm, dropout, Adam
with single-tensor updates, a shuffled DataLoader), bitwise reproducible on CPU, runs twice per
control in this process. A fault is planted below the tracer, at the dispatcher, as a
nondeterministic kernel would be: from step ``fire_step`` on, the first call of one op in one place
(a module's forward, a module's backward, one parameter's optimizer update, the data loader) gets
outputs that differ from run to run (a few ULPs per element from an unseeded generator, or a random
permutation of its rows). The fault's own hooks pick the place; the localizer does not know it.

Each control: both runs in step-digest mode (the runs being diagnosed), the first divergent step
from their digests, then one trace replay per run of that step (2 replays), and the answer
compared with the planted (op, module, phase). Clean pairs: the same without a fault; a
localization there is a false one.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from steady.worker.contract.oplocate import OpDivergence, first_divergent_op, first_divergent_step, named_exactly
from steady.worker.inrun import localize
from steady.worker.inrun.localize import Localizer

localize.USER_FILES.add(os.path.realpath(__file__))  # this file stands for the user's training script

STEPS = 5


class Pool(nn.Module):
    """Sum-pool feature groups with ``index_add_`` (a custom layer, the kind that hides a scatter)."""

    def __init__(self, width: int, groups: int) -> None:
        super().__init__()
        self.groups = groups
        self.index: torch.Tensor
        self.register_buffer("index", torch.arange(width) % groups)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = h.new_zeros(h.shape[0], self.groups)
        return out.index_add_(1, self.index, h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.act1 = nn.Tanh()
        self.hidden = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.act2 = nn.Tanh()
        self.drop = nn.Dropout(0.1)
        self.pool = Pool(32, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act1(self.embed(x))
        h = self.drop(self.act2(self.norm(self.hidden(h))))
        return self.head(self.pool(h))


@dataclass(frozen=True)
class Fault:
    """``op`` perturbed at its first call in ``where`` from step ``fire_step`` on."""

    name: str
    op: str
    where: str  # "forward:<attr>", "backward:<attr>", "optimizer:<attr>.<param>", "data", "top:forward", "top:backward"
    kind: str = "ulp"  # or "permute": a random permutation of the output's rows
    fire_step: int = 2

    @property
    def expected(self) -> tuple[str, str, str]:
        """(op, module, phase) the answer must name."""
        place, _, target = self.where.partition(":")
        if place == "data":
            return self.op, "DataLoader", "data"
        if place == "top":
            return self.op, "", target
        if place == "optimizer":
            return self.op, f"Net.{target}", "optimizer"
        return self.op, f"Net.{target}", place


FAULTS = [
    Fault("embed matmul", "aten::addmm", "forward:embed"),
    Fault("tanh", "aten::tanh", "forward:act1"),
    Fault("hidden matmul", "aten::addmm", "forward:hidden"),
    Fault("hidden rows permuted", "aten::addmm", "forward:hidden", kind="permute"),
    Fault("layer norm", "aten::native_layer_norm", "forward:norm"),
    Fault("second tanh", "aten::tanh", "forward:act2"),
    Fault("dropout mask", "aten::bernoulli_", "forward:drop", kind="permute"),
    Fault("pool scatter", "aten::index_add_", "forward:pool"),
    Fault("head matmul", "aten::addmm", "forward:head"),
    Fault("log-softmax in the loss", "aten::_log_softmax", "top:forward"),
    Fault("head grad matmul", "aten::mm", "backward:head"),
    Fault("hidden grad matmul", "aten::mm", "backward:hidden"),
    Fault("tanh backward", "aten::tanh_backward", "backward:act2"),
    Fault("layer norm backward", "aten::native_layer_norm_backward", "backward:norm"),
    Fault("pool backward gather", "aten::index_select", "backward:pool"),
    Fault("log-softmax backward", "aten::_log_softmax_backward_data", "top:backward"),
    Fault("Adam update of hidden.weight", "aten::addcdiv_", "optimizer:hidden.weight"),
    Fault("Adam update of head.bias", "aten::addcdiv_", "optimizer:head.bias"),
    Fault("Adam first moment of embed.weight", "aten::lerp_", "optimizer:embed.weight"),
    Fault("Adam second moment of norm.weight", "aten::mul_", "optimizer:norm.weight"),
    Fault("batch permuted in collate", "aten::stack", "data", kind="permute"),
    Fault("batch values in collate", "aten::stack", "data"),
    Fault("epoch order (sampler)", "aten::randperm", "data", kind="permute", fire_step=0),
]

_entropy = random.SystemRandom()


def _perturb(out: torch.Tensor, kind: str) -> None:
    """In place: a few ULPs per element, or a random non-identity permutation of the rows."""
    with torch.no_grad():
        if kind == "permute" and out.dim() >= 1 and out.shape[0] > 1:
            n = out.shape[0]
            perm = list(range(n))
            while perm == list(range(n)):
                _entropy.shuffle(perm)
            out.copy_(out.clone()[torch.tensor(perm)])
        elif out.is_floating_point() and out.dtype == torch.float32:
            bits = out.view(torch.int32)
            noise = torch.tensor([_entropy.randint(1, 16) for _ in range(out.numel())],
                                 dtype=torch.int32).reshape(out.shape)
            bits.add_(noise)
        else:
            raise ValueError(f"cannot perturb a {out.dtype} with {kind!r}")


class PlantedFault(TorchDispatchMode):
    """The fault below the tracer: the places come from its own hooks, not the localizer's."""

    def __init__(self, fault: Fault, model: Net, optimizer: Any) -> None:
        super().__init__()
        self.fault = fault
        self.step = 0
        self.inside = False
        self.fired_at = -1
        self.handles: list[Any] = []
        place, _, target = fault.where.partition(":")
        if place == "forward":
            m = getattr(model, target)
            self.handles += [m.register_forward_pre_hook(lambda *a: self._set(True)),
                             m.register_forward_hook(lambda *a: self._set(False))]
        elif place == "backward":
            m = getattr(model, target)
            self.handles += [m.register_full_backward_pre_hook(lambda *a: self._set(True)),
                             m.register_full_backward_hook(lambda *a: self._set(False))]
        elif place == "optimizer":
            attr, _, pname = target.partition(".")
            param = getattr(getattr(model, attr), pname)
            self.param, self.optimizer = param, optimizer
            self.handles += [optimizer.register_step_pre_hook(lambda *a: self._set(True))]
        self.place, self.target = place, target
        self.handles.append(optimizer.register_step_post_hook(self._stepped))

    def _set(self, value: bool) -> None:
        self.inside = value

    def _stepped(self, *args: Any) -> None:
        self.step += 1
        if self.place == "optimizer":
            self.inside = False

    def _hit(self, name: str, args: Any) -> bool:
        if name != self.fault.op or self.step < self.fault.fire_step or self.fired_at == self.step:
            return False
        if self.place in ("forward", "backward"):
            return self.inside
        if self.place == "optimizer":
            owned = {t.untyped_storage().data_ptr() for t in (self.param, self.param.grad,
                                                              *self.optimizer.state.get(self.param, {}).values())
                     if isinstance(t, torch.Tensor)}
            return self.inside and any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in owned
                                       for a in args)
        if self.place == "top":
            grad = torch._C._current_autograd_node() is not None
            return grad == (self.target == "backward")
        return True  # "data": ops that only the loader runs

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if self._hit(name, args):
            self.fired_at = self.step
            _perturb(out if isinstance(out, torch.Tensor) else out[0], self.fault.kind)
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def train(fault: Fault | None, localizer: Localizer | None, *, steps: int = STEPS) -> None:
    """The training; bitwise reproducible without a fault. Stops after the traced step."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(2))
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    planted = PlantedFault(fault, model, opt) if fault is not None else None
    if planted is not None:
        planted.__enter__()
    try:
        if localizer is not None:
            localizer.install()
        for step, (xb, yb) in enumerate(loader):
            if step >= steps or (localizer is not None and localizer.traced):
                break
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
    finally:
        if localizer is not None:
            localizer.close()
        if planted is not None:
            planted.__exit__(None, None, None)
            planted.close()


@dataclass
class Diagnosis:
    parted: bool  # the step digests differ somewhere
    step: int | None
    answer: OpDivergence | None
    replays: int
    seconds: float


def diagnose(fault: Fault | None, *, trace_anyway: int | None = None) -> Diagnosis:
    """Two runs with step digests, then (if they part) one trace replay of that step per run.
    ``trace_anyway``: the step to trace when the digests agree (the clean pairs check the tracer too)."""
    t0 = time.perf_counter()
    a, b = Localizer("steps"), Localizer("steps")
    train(fault, a)
    train(fault, b)
    k = first_divergent_step(a.digests, b.digests)
    if k is None and trace_anyway is None:
        return Diagnosis(False, None, None, 0, time.perf_counter() - t0)
    parted = k is not None
    if k is None:
        assert trace_anyway is not None
        k = trace_anyway
    ta, tb = Localizer("trace", step=k), Localizer("trace", step=k)
    train(fault, ta)
    train(fault, tb)
    answer = first_divergent_op(ta.trace, tb.trace, step=k)
    return Diagnosis(parted, k, answer, 2, time.perf_counter() - t0)


def overhead(width: int, *, steps: int = 30, reps: int = 3) -> tuple[float, float]:
    """Seconds per training step of an MLP ``width`` wide (3 layers, Adam), without and with the step
    digests (best of ``reps``): what ``STEADY_LOCALIZE=steps`` costs."""
    def run(loc: Localizer | None) -> float:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                              nn.Linear(width, 10))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(64, width), torch.randint(0, 10, (64,))
        if loc is not None:
            loc.install()
        try:
            t0 = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            return (time.perf_counter() - t0) / steps
        finally:
            if loc is not None:
                loc.close()

    off = min(run(None) for _ in range(reps))
    on = min(run(Localizer("steps")) for _ in range(reps))
    return off, on


def _module_shown(module: str) -> str:
    return f"`{module}`" if module else "(no module)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m steady.worker.inrun.localize_controls",
                                description="planted single-op faults in a PyTorch training, localized")
    p.add_argument("--clean", type=int, default=50, help="clean repeat pairs (no fault)")
    p.add_argument("--faults", default="all", help="'all' or comma-separated indices into the fault list")
    p.add_argument("--overhead", action="store_true", help="also measure the step digests' cost")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the training (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.overhead:
        print("| MLP width | parameters | step, digests off | step, digests on | overhead |")
        print("| --- | --- | --- | --- | --- |")
        for width in (64, 256, 1024):
            off, on = overhead(width)
            n = 2 * width * width + 10 * width + 2 * width + 10
            print(f"| {width} | {n:,} | {off * 1e3:.2f} ms | {on * 1e3:.2f} ms | {100 * (on / off - 1):+.0f}% |",
                  flush=True)
        print()
    chosen = FAULTS if args.faults == "all" else [FAULTS[int(i)] for i in args.faults.split(",")]
    print("| # | planted fault | op | module | phase | fires from step | first divergent step | named | replays |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    hits = 0
    for i, fault in enumerate(chosen):
        d = diagnose(fault)
        op, module, phase = fault.expected
        got = d.answer
        ok = named_exactly(got, (op, module, phase), step=d.step, fire_step=fault.fire_step)
        hits += ok
        named = "yes" if ok else f"NO: {got.sentence() if got else 'nothing'}"
        print(f"| {i + 1} | {fault.name}{' (permutation)' if fault.kind == 'permute' else ''} | `{op}` | "
              f"{_module_shown(module)} | {phase} | {fault.fire_step} | {d.step} | {named} | {d.replays} |", flush=True)
    false = 0
    t0 = time.perf_counter()
    for _ in range(args.clean):
        d = diagnose(None, trace_anyway=STEPS // 2)  # digests agree: trace a step anyway, no op may differ
        false += d.parted or d.answer is not None
    clean_s = time.perf_counter() - t0
    print(f"\nnamed exactly: {hits}/{len(chosen)}; false localizations on clean pairs: {false}/{args.clean} "
          f"({clean_s:.1f} s for the clean pairs)")
    return 0 if hits == len(chosen) and false == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
