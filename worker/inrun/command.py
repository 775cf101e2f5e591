"""In-process set-up of a command workload (called from worker/inrun/shim/sitecustomize.py).

What the worker applies to a command: the determinism environment (``PYTHONHASHSEED``,
``CUBLAS_WORKSPACE_CONFIG``, ``TF_DETERMINISTIC_OPS``, thread counts, ``CUDA_VISIBLE_DEVICES``)
before the interpreter starts, always; and, when the command is a Python interpreter that
imports this shim, the in-process switches of :func:`steady.worker.inrun.frameworks.apply_determinism` (seeds of
``random``, NumPy and the framework; ``torch.use_deterministic_algorithms`` and cuDNN flags
at ``strict``), the fingerprint, the automatic digests of :mod:`steady.worker.inrun.autodigest` (torch's
optimizer hook and DataLoader order, Keras' ``fit``: initial weights before the first step, final
weights and the data order at exit),
and a result event at exit with the SDK's final values.
"""

from __future__ import annotations

import atexit
import json
import os
import time

from steady.worker.inrun import sdk
from steady.worker.contract.events import SPEC_ENV


def start() -> None:
    from steady.worker.inrun import autodigest
    from steady.worker.inrun import frameworks, rankstate, resumestate, resumestate_keras
    from steady.worker.inrun.harness import _resolve_device

    t0 = time.perf_counter()
    with open(os.environ[SPEC_ENV], encoding="utf-8") as f:
        spec = json.load(f)
    ctx = sdk.RunContext.from_spec(spec)
    sdk._start(ctx)
    applied = frameworks.apply_determinism(ctx.determinism, ctx.seed, ctx.framework, ctx.threads)
    ctx.device = _resolve_device(ctx.framework, ctx.device)
    applied["device"] = ctx.device
    applied["applied_by"] = "command shim (sitecustomize)"
    sdk.emit({"e": "determinism", "value": applied})
    sdk.emit({"e": "fingerprint", "value": frameworks.run_fingerprint(ctx.framework)})
    # never raises; hooks only torch and TensorFlow (importing one for another framework is slow)
    finish_digests = autodigest.install(ctx.framework)  # other frameworks: only a note that there is no digest
    if ctx.framework == "torch":
        from steady.worker.inrun import localize

        localize.install_from_env()  # off unless the agent asked (steady localize)
    elif ctx.framework == "tensorflow":
        from steady.worker.inrun import localize_keras

        localize_keras.install_from_env()
    finish_resume = (resumestate_keras.install_from_env(ctx.framework) if ctx.framework == "tensorflow"
                     else resumestate.install(ctx.framework))  # a launch of the resume check, else nothing
    finish_ranks = rankstate.install(ctx.framework)  # a rank of a multi-process run, else nothing

    def finish() -> None:
        finish_resume()
        finish_ranks()
        finish_digests()
        final, timings = sdk._summary()
        timings["harness_s"] = time.perf_counter() - t0
        sdk.emit({"e": "result", "final_metrics": final, "timings": timings})

    atexit.register(finish)
