"""The built-in workloads' optimizers (``steady.worker.inrun.frameworks.torch``: SGD with momentum and Adam,
written out) make the update ``torch.optim`` makes, bit for bit, without importing ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from steady.worker.inrun.frameworks.torch import SGD, Adam, optimizer_digest  # noqa: E402


def _train(make, steps: int = 25) -> list[torch.Tensor]:
    """A small two-layer model with a sparse-ish gradient (a ReLU), trained from fixed weights and batches."""
    g = torch.Generator().manual_seed(3)
    w1 = torch.nn.Parameter(torch.randn(12, 7, generator=g))
    w2 = torch.nn.Parameter(torch.randn(3, 12, generator=g) * 0.3)
    b = torch.nn.Parameter(torch.zeros(3))
    never = torch.nn.Parameter(torch.ones(2))  # no gradient: skipped by both
    opt = make([w1, w2, b, never])
    for _ in range(steps):
        x = torch.randn(16, 7, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(torch.relu(x @ w1.T) @ w2.T + b, y)
        loss.backward()
        opt.step()
    return [w1.detach().clone(), w2.detach().clone(), b.detach().clone(), never.detach().clone()]


@pytest.mark.parametrize(("ours", "theirs"), [
    (lambda p: SGD(p, lr=0.3, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.9)),
    (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (lambda p: Adam(p, lr=5e-3, betas=(0.8, 0.99), eps=1e-6),
     lambda p: torch.optim.Adam(p, lr=5e-3, betas=(0.8, 0.99), eps=1e-6)),
], ids=["sgd-momentum", "sgd", "adam", "adam-betas"])
def test_the_written_out_update_is_torch_optims_bit_for_bit(ours, theirs):
    mine, reference = _train(ours), _train(theirs)
    for a, b in zip(mine, reference):
        assert torch.equal(a, b), (a - b).abs().max()
    assert torch.equal(mine[-1], torch.ones(2))


def test_the_optimizer_state_digest_follows_the_state():
    def digest(steps: int, lr: float = 0.01) -> str:
        holder: list = []
        _train(lambda p: holder.append(Adam(p, lr=lr)) or holder[0], steps=steps)
        return optimizer_digest(holder[0])

    assert digest(3) == digest(3)
    assert digest(3) != digest(4)
    assert digest(3) != digest(3, lr=0.02)


def test_a_built_in_workloads_optimizer_does_not_import_dynamo():
    # torch.optim's first call imports torch._dynamo (about 1 s of CPU per run): the reason these exist
    code = (
        "import sys, torch; from steady.worker.inrun.frameworks.torch import SGD, Adam; "
        "w = torch.nn.Parameter(torch.ones(3)); "
        "opt = Adam([w]); (w * 2).sum().backward(); opt.step(); "
        "opt = SGD([w], lr=0.1, momentum=0.9); (w * 2).sum().backward(); opt.step(); opt.state_dict(); "
        "assert 'torch._dynamo' not in sys.modules; "
        "torch.optim.SGD([w], lr=0.1); assert 'torch._dynamo' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_global_step_hooks_see_a_written_out_step():
    """The localizer and the automatic digests hook every optimizer's step through torch's global hooks: a
    built-in workload's steps must reach them as torch.optim's do, with the state keyed by parameter."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    seen: list[tuple[str, int, int]] = []

    def pre(opt, args, kwargs):
        seen.append(("pre", len(opt.param_groups[0]["params"]), len(opt.state)))

    def post(opt, args, kwargs):
        params = opt.param_groups[0]["params"]
        seen.append(("post", len(params), sum(len(opt.state.get(p, {})) for p in params)))

    handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        _train(lambda p: Adam(p, lr=0.01), steps=2)
        _train(lambda p: SGD(p, lr=0.1, momentum=0.9), steps=1)
    finally:
        for h in handles:
            h.remove()
    # 4 parameters, 3 with a gradient: Adam keeps step, exp_avg and exp_avg_sq for each, SGD one buffer
    assert seen == [("pre", 4, 0), ("post", 4, 9), ("pre", 4, 3), ("post", 4, 9), ("pre", 4, 0), ("post", 4, 3)]
