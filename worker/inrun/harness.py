"""Entry point of the run subprocess: ``python -m steady.worker.inrun.harness``.

The runner starts it with the determinism environment already set (``PYTHONHASHSEED``,
``CUBLAS_WORKSPACE_CONFIG``, ``TF_DETERMINISTIC_OPS``, thread counts, ``CUDA_VISIBLE_DEVICES``)
and passes the run spec file in ``STEADY_RUN_SPEC`` and the event file in
``STEADY_EVENTS_FILE``. The harness applies the in-process determinism switches before the
workload imports anything else, records the fingerprint, runs the built-in workload or the
user's entrypoint, and writes a ``result`` or ``error`` event. Exit status: 0 on success,
1 when the training code raised.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import runpy
import sys
import time
import traceback
from typing import Any

from steady.worker.inrun import sdk
from steady.worker.contract.events import SPEC_ENV


def _defines_main(path: str) -> bool:
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "main" for n in tree.body)


def _load_file(path: str) -> Any:
    """Import the file at ``path`` as a module named after it (its folder first on sys.path)."""
    import importlib.util

    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _call(func: Any, ctx: sdk.RunContext) -> Any:
    try:
        takes_ctx = len(inspect.signature(func).parameters) > 0
    except (TypeError, ValueError):
        takes_ctx = True
    return func(ctx) if takes_ctx else func()


def _call_entrypoint(entrypoint: str, ctx: sdk.RunContext) -> Any:
    """Run user code; paths are relative to the working directory (the spec's folder in the code).

    ``path.py:fn`` imports the file and calls ``fn(ctx)``; bare ``path.py`` calls ``main(ctx)``
    when the file defines a top-level ``main``, else runs it as ``__main__``;
    ``package.module:fn`` imports the module (the code's folders are on sys.path) and calls ``fn``.
    """
    target, _, func_name = entrypoint.partition(":")
    if target.endswith(".py"):
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"entrypoint file {target} not found in {os.getcwd()}")
        sys.path.insert(0, os.path.dirname(path))
        sys.argv = [path]
        if func_name or _defines_main(path):
            module = _load_file(path)
            return _call(_attribute(module, func_name or "main", entrypoint), ctx)
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        return None
    if not func_name:
        raise ValueError(f"entrypoint {entrypoint!r} is neither 'module:function' nor a path to a .py script")
    return _call(_attribute(importlib.import_module(target), func_name, entrypoint), ctx)


def _attribute(module: Any, dotted: str, entrypoint: str) -> Any:
    obj = module
    for part in dotted.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"entrypoint {entrypoint!r}: {getattr(module, '__name__', module)} has no {dotted!r}")
        obj = getattr(obj, part)
    return obj


def _resolve_device(framework: str, wanted: str) -> str:
    # code that uses no ML framework runs on the CPU as far as the worker can tell (and asking a
    # framework whether a GPU is there would import it)
    if wanted == "cpu" or framework == "python":
        return "cpu"
    if framework == "torch":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    return "cuda" if tf.config.list_physical_devices("GPU") else "cpu"


def run(spec: dict[str, Any]) -> int:
    t0 = time.perf_counter()
    ctx = sdk.RunContext.from_spec(spec)
    sdk._start(ctx)
    try:
        from steady.worker.inrun import frameworks

        workload = None
        if spec.get("workload"):
            from steady.worker.inrun.workloads import load

            workload = load(spec["workload"])
            if ctx.framework not in workload.FRAMEWORKS:
                raise ValueError(f"workload {spec['workload']!r} runs on {workload.FRAMEWORKS}, not {ctx.framework!r}")
        elif not spec.get("entrypoint"):
            raise ValueError("the run spec names neither a workload nor an entrypoint")
        applied = frameworks.apply_determinism(ctx.determinism, ctx.seed, ctx.framework, ctx.threads)
        ctx.device = _resolve_device(ctx.framework, ctx.device)
        applied["device"] = ctx.device
        sdk.emit({"e": "determinism", "value": applied})
        sdk.emit({"e": "fingerprint", "value": frameworks.run_fingerprint(ctx.framework)})
        t_setup = time.perf_counter()
        if ctx.framework == "torch":  # off unless asked (a study's `localize: steps`, steady localize)
            from steady.worker.inrun import localize

            localize.install_from_env()
        elif ctx.framework == "tensorflow":
            from steady.worker.inrun import localize_keras

            localize_keras.install_from_env()
        from steady.worker.inrun import rankstate

        finish_ranks = rankstate.install(ctx.framework)  # a rank of a multi-process run, else nothing
        if workload is not None:
            returned = workload.run(ctx)
            finish_ranks()
        else:
            from steady.worker.inrun import autodigest, resumestate, resumestate_keras

            finish_digests = autodigest.install(ctx.framework)
            finish_resume = (resumestate_keras.install_from_env(ctx.framework) if ctx.framework == "tensorflow"
                             else resumestate.install(ctx.framework))  # a launch of the resume check, else nothing
            returned = _call_entrypoint(spec["entrypoint"], ctx)
            finish_resume()
            finish_ranks()
            finish_digests()
        t_end = time.perf_counter()
        final, timings = sdk._summary()
        if isinstance(returned, dict):
            for k, v in returned.items():
                try:
                    final[str(k)] = float(v)
                except (TypeError, ValueError):
                    pass
        timings.update(setup_s=t_setup - t0, run_s=t_end - t_setup, harness_s=t_end - t0)
        sdk.emit({"e": "result", "final_metrics": final, "timings": timings})
        return 0
    except BaseException as exc:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        message = f"{type(exc).__name__}: {exc}"
        sdk.emit({"e": "error", "error": message[:4000], "traceback": tb[-20000:]})
        return 1


def main() -> int:
    with open(os.environ[SPEC_ENV], encoding="utf-8") as f:
        spec = json.load(f)
    code = run(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    # os._exit skips interpreter teardown (and its occasional hangs in framework atexit
    # handlers); every event was already written with an unbuffered write.
    code = main()
    os._exit(code)
