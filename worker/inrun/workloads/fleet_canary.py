"""The fleet canary: a tiny PyTorch MLP on digits, a few dozen steps, meant to run many times on many workers
(``steady fleet check``). Params: steps=24, batch_size=32, hidden=32, lr=1e-2.

At ``strict`` on one stack it is bit-repeatable: every run logs the same loss at every step and ends on the same
weight and optimizer-state digests, so a worker whose runs differ computes differently.

A planted fault for tests and demonstrations (``STEADY_FAULT``, which the agent passes to this workload only):
it changes what the canary's linear layers output, inside the run's process.

* ``bitflip:p=0.01``: with probability p per linear layer call, one bit (a high mantissa bit) of one element
  of its output flips; drawn from the operating system's entropy, not the run's seed, so repeats are hit at
  different places (an intermittent fault);
* ``wrong_kernel``: the first layer's output is scaled by 1 + 2⁻¹²: every run, the same way (a consistent fault);
* ``reduction_order``: each layer's matrix product sums its input features in reverse order: the same value up
  to rounding, different bits (a consistent fault);
* ``slow``: each layer call sleeps ``s`` seconds (``slow:s=0.02``): a slow device, right numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.torch import Adam, data_generator, device, module_digest, optimizer_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)
FAULT_ENV = "STEADY_FAULT"
FAULT_KINDS = ("bitflip", "wrong_kernel", "reduction_order", "slow")


def parse_fault(text: str | None) -> tuple[str, dict[str, float]] | None:
    """``'bitflip:p=0.01'`` → ``('bitflip', {'p': 0.01})``; None for no fault."""
    if not text:
        return None
    kind, _, rest = text.partition(":")
    if kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_ENV}={text!r}: the fault kinds are {', '.join(FAULT_KINDS)}")
    options = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        options[key.strip()] = float(value)
    return kind, options


def _reordered_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` with the input features summed in reverse order (one matrix product over the reversed
    features): the same value up to rounding, other bits."""
    out = x.flip(1) @ layer.weight.flip(1).T
    return out + layer.bias if layer.bias is not None else out


def fault_hook(kind: str, options: dict[str, float], *, first: bool) -> Callable[..., Any] | None:
    """A forward hook on a linear layer that plants the fault (None: nothing to plant on this layer)."""
    if kind == "bitflip":
        p = float(options.get("p", 0.01))
        rng = np.random.default_rng()  # the OS's entropy, not the run's seed: repeats are hit differently

        def flip(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor | None:
            if rng.random() >= p:
                return None
            out = output.clone()
            bits = out.detach().reshape(-1).view(torch.int32)  # shares out's storage
            bits[int(rng.integers(bits.numel()))] ^= 1 << 21  # a high mantissa bit of one element
            return out

        return flip
    if kind == "wrong_kernel":
        return (lambda module, inputs, output: output * (1 + 2.0 ** -12)) if first else None
    if kind == "reduction_order":
        return lambda module, inputs, output: _reordered_linear(inputs[0], module)
    if kind == "slow":
        seconds = float(options.get("s", 0.02))

        def slow(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            time.sleep(seconds)

        return slow
    return None


def run(ctx: sdk.RunContext) -> dict:
    fault = parse_fault(os.environ.get(FAULT_ENV))
    split = digits_split(ctx.param("split_seed", 0))
    hidden = int(ctx.param("hidden", 32))
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    if fault is not None:
        kind, options = fault
        for i, layer in enumerate(m for m in model if isinstance(m, nn.Linear)):
            hook = fault_hook(kind, options, first=i == 0)
            if hook is not None:
                layer.register_forward_hook(hook)
    dev = device(ctx.device)
    model.to(dev)
    sdk.set_digest("initial_weights", module_digest(model))
    x = torch.from_numpy(split.x_train).to(dev)
    y = torch.from_numpy(split.y_train).to(dev)
    generator = data_generator(ctx.data_seed)
    batch = int(ctx.param("batch_size", 32))
    optimizer = Adam(model.parameters(), lr=float(ctx.param("lr", 1e-2)))
    steps = int(ctx.param("steps", 24))
    order = torch.randperm(len(x), generator=generator)
    for step in range(steps):
        t0 = time.perf_counter()
        idx = order[(step * batch) % len(x):][:batch]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        value = loss.item()
        sdk.log(step, loss=value, step_time=time.perf_counter() - t0)
    sdk.log_data_order(order.numpy()[: steps * batch], epoch=0)
    sdk.set_digest("final_weights", module_digest(model))
    sdk.set_digest("optimizer_state", optimizer_digest(optimizer))
    return {"train_steps": float(steps)}
