"""The sources study's built-in model without a framework: the MLP of ``torch_sources`` in NumPy (float32).

The same network, data, training and sources as :mod:`steady.worker.inrun.workloads.torch_sources`, with the
backward pass written out. It runs on ``framework: python``, so a run costs no framework start-up: on the
2-core development machine a run of ``torch_sources`` spends about 1.7 s importing PyTorch and 1.2 s training,
this one about 0.4 s in all, which is what lets a sources study reach its decisions (hundreds of runs per arm)
on a CPU.

Params: epochs=30, batch_size=32, lr=0.2, momentum=0.9, hidden=64, dropout=0.2, noise=0.05, eval_every=15,
as ``torch_sources``. Each source reads ``ctx.seed_for(source)``:

- ``init``: the generator the weights are drawn from (uniform ±1/√fan_in, as ``nn.Linear``);
- ``data``: the shuffle of each epoch;
- ``dropout``: the dropout masks and the Gaussian input noise (augmentation);
- ``numerics``: the order of the samples inside each batch, drawn after masks and noise are attached to their
  samples: the gradient is the same sum in another floating-point reduction order (BLAS and NumPy's pairwise
  sums), the CPU's counterpart of nondeterministic kernels;
- ``ulp``: the index of the one weight moved by one ULP (``nextafter`` towards +∞) before step 0.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from steady.worker.inrun import sdk
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("python",)
PARAM_NAMES = ("w1", "b1", "w2", "b2")


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)  # None (determinism "none"): fresh entropy


def init_params(hidden: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Weights as ``nn.Linear`` draws them: uniform in ±1/√fan_in, float32."""
    out = {}
    for name, (fan_out, fan_in) in (("1", (hidden, 64)), ("2", (10, hidden))):
        bound = 1.0 / np.sqrt(fan_in)
        out["w" + name] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        out["b" + name] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return out


def perturb_one_weight(params: dict[str, np.ndarray], index: int) -> tuple[str, int]:
    """Move the weight at flat ``index`` (modulo the parameter count) by one ULP towards +∞; its name and index."""
    total = sum(params[n].size for n in PARAM_NAMES)
    k = index % total
    for name in PARAM_NAMES:
        p = params[name]
        if k < p.size:
            flat = p.reshape(-1)
            flat[k] = np.nextafter(flat[k], np.float32(np.inf))
            return name, k
        k -= p.size
    raise AssertionError("unreachable")


def _logits(p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ p["w1"].T + p["b1"], 0) @ p["w2"].T + p["b2"]


def _cross_entropy(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and the softmax probabilities."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    loss = float(np.mean(np.log(s[:, 0]) - z[np.arange(len(y)), y]))
    return loss, e / s


def loss_and_grads(params: dict[str, np.ndarray], xb: np.ndarray, yb: np.ndarray,
                   mask: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Mean cross-entropy of ``relu(x W1ᵀ + b1) · mask`` through ``W2``, and its gradient by hand."""
    pre = xb @ params["w1"].T + params["b1"]
    h = np.maximum(pre, 0) * mask
    loss, prob = _cross_entropy(h @ params["w2"].T + params["b2"], yb)
    d_logits = prob
    d_logits[np.arange(len(yb)), yb] -= 1.0
    d_logits /= np.float32(len(yb))
    d_h = (d_logits @ params["w2"]) * mask * (pre > 0)
    return loss, {"w2": d_logits.T @ h, "b2": d_logits.sum(axis=0), "w1": d_h.T @ xb, "b1": d_h.sum(axis=0)}


def run(ctx: sdk.RunContext) -> dict[str, Any]:
    split = digits_split(ctx.param("split_seed", 0))
    hidden, p_drop, noise = ctx.param("hidden", 64), ctx.param("dropout", 0.2), ctx.param("noise", 0.05)
    epochs, batch, lr = ctx.param("epochs", 30), ctx.param("batch_size", 32), ctx.param("lr", 0.2)
    mu = ctx.param("momentum", 0.9)
    eval_every = max(1, ctx.param("eval_every", 15))
    params = init_params(hidden, _rng(ctx.seed_for("init")))
    ulp = ctx.seed_for("ulp")
    if ulp is not None:
        name, k = perturb_one_weight(params, ulp)
        sdk.emit({"e": "info", "value": {"ulp_perturbed": f"{name}[{k}]"}})
    sdk.set_digest("initial_weights", sdk.digest_model(params))
    g_data, g_drop, g_num = (_rng(ctx.seed_for(s)) for s in ("data", "dropout", "numerics"))
    x_tr, y_tr, x_val, y_val = split.x_train, split.y_train, split.x_val, split.y_val
    momentum = {n: np.zeros_like(params[n]) for n in PARAM_NAMES}
    lr32, mu32 = np.float32(lr), np.float32(mu)
    keep = np.float32(1.0 / (1.0 - p_drop))
    n, step = len(x_tr), 0

    def evaluate() -> None:
        loss, prob = _cross_entropy(_logits(params, x_val), y_val)
        sdk.log(step, val_loss=loss, val_acc=100.0 * float(np.mean(prob.argmax(1) == y_val)))

    evaluate()
    for epoch in range(epochs):
        order = g_data.permutation(n)
        sdk.log_data_order(order, epoch=epoch)
        for start in range(0, n, batch):
            t0 = time.perf_counter()
            idx = order[start:start + batch]
            xb, yb = x_tr[idx], y_tr[idx]
            xb = xb + np.float32(noise) * g_drop.standard_normal(xb.shape, dtype=np.float32)
            mask = (g_drop.random((len(idx), hidden), dtype=np.float32) >= p_drop) * keep
            within = g_num.permutation(len(idx))
            xb, yb, mask = xb[within], yb[within], mask[within]
            loss, grads = loss_and_grads(params, xb, yb, mask)
            for name in PARAM_NAMES:
                m = momentum[name]
                m *= mu32
                m += grads[name]
                params[name] -= lr32 * m
            step += 1
            sdk.log(step, loss=loss, step_time=time.perf_counter() - t0)
            if step % eval_every == 0:
                evaluate()
    if step % eval_every:
        evaluate()
    sdk.set_digest("final_weights", sdk.digest_model(params))
    sdk.set_digest("optimizer_state", sdk.digest_model({f"m_{n}": momentum[n] for n in PARAM_NAMES}))
    return {"train_steps": float(step)}
