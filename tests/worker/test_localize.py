"""Localization: the order-aware hashes, the alignment of two op traces, and planted single-op faults
named by op, module and phase (in process: the training is small and the process boundary is not the
point here; tests/reports/test_localize_e2e.py drives a user's script through `steady localize`)."""

from __future__ import annotations

import pytest
import torch

from steady.worker.contract.oplocate import first_divergent_op, first_divergent_step, recorded_divergence
from steady.worker.inrun import localize_controls as controls
from steady.worker.inrun.localize import Localizer, tensor_hash


def test_hash_sees_a_permutation_and_a_swapped_pair_that_an_xor_of_element_hashes_misses():
    x = torch.arange(16, dtype=torch.float32) / 7
    swapped = x.clone()
    swapped[[3, 11]] = swapped[[11, 3]]
    permuted = x[torch.tensor([5, 2, 9, 0, 1, 3, 4, 6, 7, 8, 10, 11, 12, 13, 14, 15])]
    # the same multiset of values: an order-blind hash (XOR of per-element hashes) is equal
    xor = []
    for t in (x, swapped, permuted):
        acc = 0
        for v in t.view(torch.int32).tolist():
            acc ^= hash(v)
        xor.append(acc)
    assert xor[0] == xor[1] == xor[2]
    assert len({tensor_hash(x), tensor_hash(swapped), tensor_hash(permuted)}) == 3
    assert tensor_hash(x) == tensor_hash(x.clone())
    assert tensor_hash(x) != tensor_hash(x.reshape(4, 4))  # the shape is part of it
    one_ulp = x.clone()
    one_ulp.view(torch.int32)[5] += 1
    assert tensor_hash(one_ulp) != tensor_hash(x)


def test_first_divergent_step():
    assert first_divergent_step(["a", "b", "c"], ["a", "b", "c"]) is None
    assert first_divergent_step(["a", "b", "c"], ["a", "x", "y"]) == 1
    assert first_divergent_step(["a", "b"], ["a", "b", "c"]) == 2  # one run stopped early


def test_recorded_divergence_from_two_runs_step_digest_series():
    """What `steady localize` and a localization job read from the runs' recorded `steady.step_digest` series."""
    assert recorded_divergence({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0, 1: 2.0, 2: 3.0}) == (None, 3)
    assert recorded_divergence({0: 1.0, 1: 2.0, 2: 3.0}, {2: 9.0, 0: 1.0, 1: 2.5}) == (1, 3)
    assert recorded_divergence({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0, 2: 3.0}) == (2, 2)  # one run recorded a step more


def _rec(op, module, phase, inputs, output):
    return {"op": op, "module": module, "phase": phase, "line": "train.py:1", "inputs": inputs,
            "output": output, "args": ""}


def test_alignment_op_by_op_and_the_module_boundary_fallback():
    a = [_rec("aten::addmm", "M.fc", "forward", "i0", "o1"), _rec("aten::relu", "M.act", "forward", "o1", "o2"),
         _rec("aten::sum", "", "forward", "o2", "o3")]
    assert first_divergent_op(a, [dict(r) for r in a], step=3) is None
    b = [dict(r) for r in a]
    b[1]["output"], b[2]["inputs"], b[2]["output"] = "x2", "x2", "x3"
    got = first_divergent_op(a, b, step=3)
    assert (got.op, got.module, got.inputs_identical, got.aligned_by, got.index) == (
        "aten::relu", "M.act", True, "ops", 1)
    # an input no traced op made (every earlier output agreed): from outside the framework's ops
    c = [dict(r) for r in a]
    c[1]["inputs"], c[1]["output"] = "from-numpy", "x2"
    got = first_divergent_op(a, c, step=0)
    assert (got.op, got.cause, got.inputs_identical) == ("aten::relu", "outside", False)
    # another kernel in one run (two ops instead of one): aligned at module boundaries
    d = [a[0], _rec("aten::clamp_min", "M.act", "forward", "o1", "t"), _rec("aten::mul", "M.act", "forward", "t", "y2"),
         _rec("aten::sum", "", "forward", "y2", "y3")]
    got = first_divergent_op(a, d, step=1)
    assert (got.module, got.phase, got.aligned_by) == ("M.act", "forward", "modules")
    assert "part at op 1" in got.note and "aten::clamp_min" in got.note
    assert "aligned at module boundaries" in got.sentence()
    # the same kernel split differently but the same result: nothing to report
    e = [a[0], _rec("aten::clamp_min", "M.act", "forward", "o1", "t"), _rec("aten::mul", "M.act", "forward", "t", "o2"),
         a[2]]
    assert first_divergent_op(a, e, step=1) is None


def test_step_digests_cover_parameters_gradients_and_optimizer_state():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    base = Localizer.state_digest(opt)
    model.weight.grad.view(torch.int32)[0, 1] += 1  # only a gradient changes, by one ULP
    assert Localizer.state_digest(opt) != base
    model.weight.grad.view(torch.int32)[0, 1] -= 1
    assert Localizer.state_digest(opt) == base
    opt.state[model.bias]["exp_avg_sq"][0] *= 2  # only the optimizer state changes
    assert Localizer.state_digest(opt) != base


def test_clean_pairs_part_nowhere_and_their_traces_agree_op_by_op():
    """The clean training is bitwise reproducible: equal digests at every step, and a traced step has
    no op whose output differs (uninitialised memory, e.g. dropout's mask buffer, is not an input)."""
    d = controls.diagnose(None, trace_anyway=2)
    assert not d.parted and d.step == 2 and d.answer is None and d.replays == 2
    loc = Localizer("trace", step=2)
    controls.train(None, loc)
    ops = {r["op"] for r in loc.trace}
    assert {"aten::bernoulli_", "aten::index_add_", "aten::addcdiv_", "aten::stack"} <= ops
    assert {r["phase"] for r in loc.trace} == {"data", "forward", "backward", "optimizer"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hidden rows permuted", "pool backward gather", "Adam update of head.bias"])
def test_planted_fault_is_named_by_op_module_and_phase(name):
    fault = next(f for f in controls.FAULTS if f.name == name)
    d = controls.diagnose(fault)
    assert d.replays == 2 and d.step == fault.fire_step
    got = d.answer
    assert (got.op, got.module, got.phase) == fault.expected, got.sentence()
    assert got.inputs_identical and got.aligned_by == "ops"
    assert got.line.startswith(controls.__file__.rsplit("/", 1)[-1]) or "localize_controls.py:" in got.line


class _Lin(torch.nn.Module):
    """One kernel (addmm) in run A, two (mm, then add, then a rounding difference) in run B."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(8, 8, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(8, generator=g))
        self.fused = fused

    def forward(self, x):
        if self.fused:
            return torch.addmm(self.bias, x, self.weight.t())
        return (x @ self.weight.t() + self.bias) * (1 + 2.0 ** -20)


class _Net(torch.nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.lin = _Lin(fused)
        self.act = torch.nn.Tanh()

    def forward(self, x):
        return self.act(self.lin(x))


def test_streams_of_different_kernels_are_aligned_at_module_boundaries():
    traces = []
    for fused in (True, False):
        model = _Net(fused)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loc = Localizer("trace", step=0).install()
        try:
            model(torch.ones(4, 8)).sum().backward()
            opt.step()
        finally:
            loc.close()
        traces.append(loc.trace)
    assert [r["op"] for r in traces[0]] != [r["op"] for r in traces[1]]
    got = first_divergent_op(traces[0], traces[1], step=0)
    assert (got.module, got.phase, got.aligned_by) == ("_Net.lin", "forward", "modules"), got
    assert "aten::addmm" in got.note and "aten::mm" in got.note


JITTER = """
import torch

class Jitter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = torch.Generator()
        self.gen.seed()  # nobody seeded it

    def forward(self, h):
        return h * (1 + torch.rand(h.shape, generator=self.gen) * 1e-6)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), Jitter())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(200):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
"""


@pytest.mark.slow
def test_replays_without_recorded_digests_find_the_step_then_the_op(tmp_path):
    """The agent's driver on a command whose runs recorded nothing: a pair of digest replays (stopped
    once they part, long before step 200), then a pair tracing that step: 4 replays."""
    from steady.worker.agent.localize import localize_pair

    (tmp_path / "train.py").write_text(JITTER)
    spec = {"framework": "torch", "command": ["python", "train.py"], "seed": 1, "repeat": 0,
            "determinism": "strict", "threads": 1}
    got = localize_pair(spec, spec, code_dir=str(tmp_path))
    assert got["status"] == "localized" and got["replays"] == 4 and got["step"] == 0, got
    answer = got["answer"]
    assert (answer["op"], answer["module"], answer["phase"], answer["line"]) == (
        "aten::rand", "Sequential.1", "forward", "train.py:11"), answer
