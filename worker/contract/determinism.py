"""The three determinism levels, applied exactly as Steady's determinism guides describe.

``none``
    Nothing is fixed: no seeds, ``PYTHONHASHSEED=random``, nondeterministic kernels allowed,
    shuffles and data-loader generators drawn from fresh entropy.
``seeded``
    ``PYTHONHASHSEED=<seed>`` (set before the interpreter starts); ``random.seed``,
    ``np.random.seed``; PyTorch: ``torch.manual_seed`` + ``torch.cuda.manual_seed_all``;
    TensorFlow: ``tf.keras.utils.set_random_seed`` (Python, NumPy and TF seeds). Data order is
    seeded: a seeded ``torch.Generator`` plus ``worker_init_fn`` for DataLoader workers;
    ``tf.data`` ``shuffle(..., seed=seed, reshuffle_each_iteration=False)``.
``strict``
    ``seeded`` plus PyTorch ``torch.use_deterministic_algorithms(True)``,
    ``torch.backends.cudnn.benchmark = False``, ``torch.backends.cudnn.deterministic = True``,
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``TORCHINDUCTOR_DETERMINISTIC=1`` (what the PyTorch call sets
    in TorchInductor's config, read when Inductor is first imported); TensorFlow
    ``tf.config.experimental.enable_op_determinism()`` and ``TF_DETERMINISTIC_OPS=1``.

At every level the thread counts come from ``RunSpec.threads`` (``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` before start; ``torch.set_num_threads`` /
TensorFlow intra- and inter-op parallelism inside), and neither OpenMP nor MKL may lower
them on their own (``OMP_DYNAMIC=FALSE``, ``MKL_DYNAMIC=FALSE``). ``strict`` also asks MKL,
the CPU BLAS of PyTorch's x86 wheels, for conditional numerical reproducibility
(``MKL_CBWR=AUTO,STRICT``): the same results whatever the memory alignment of the operands.

:func:`subprocess_env` runs in the agent (no framework import);
:func:`steady.worker.inrun.frameworks.apply_determinism` runs first thing inside the run subprocess and
returns the record that ends up in ``RunResult.determinism_applied``.
"""

from __future__ import annotations

import os
from typing import Any

LEVELS = ("none", "seeded", "strict")
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
FIXED_THREADS_ENV = {"OMP_DYNAMIC": "FALSE", "MKL_DYNAMIC": "FALSE"}
MKL_CBWR = "AUTO,STRICT"
INDUCTOR_DETERMINISTIC_VAR = "TORCHINDUCTOR_DETERMINISTIC"  # read by TorchInductor's config when first imported
STRICT_ONLY_VARS = ("CUBLAS_WORKSPACE_CONFIG", INDUCTOR_DETERMINISTIC_VAR, "TF_DETERMINISTIC_OPS", "MKL_CBWR")
DETERMINISM_ENV_VARS = ("PYTHONHASHSEED", *STRICT_ONLY_VARS, *THREAD_ENV_VARS, *FIXED_THREADS_ENV,
                        "CUDA_VISIBLE_DEVICES")
CUBLAS_WORKSPACE = ":4096:8"


def level_name(level: Any) -> str:
    value = getattr(level, "value", level)
    if value not in LEVELS:
        raise ValueError(f"unknown determinism level {value!r}; expected one of {LEVELS}")
    return value


def subprocess_env(level: Any, seed: int, threads: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a run subprocess starts with (set before its interpreter starts)."""
    level = level_name(level)
    env = dict(os.environ if base is None else base)
    for var in ("PYTHONHASHSEED", *STRICT_ONLY_VARS):
        env.pop(var, None)  # an inherited setting must not leak into a weaker level
    env["PYTHONHASHSEED"] = "random" if level == "none" else str(int(seed) % (2**32))
    if level == "strict":
        env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        env[INDUCTOR_DETERMINISTIC_VAR] = "1"
        env["TF_DETERMINISTIC_OPS"] = "1"
        env["MKL_CBWR"] = MKL_CBWR
    n = str(max(1, int(threads)))
    for var in THREAD_ENV_VARS:
        env[var] = n
    env.update(FIXED_THREADS_ENV)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's banner out of the stderr tail
    return env
