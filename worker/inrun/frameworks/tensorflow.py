"""TensorFlow / Keras adapter: determinism switches, digests, fingerprint."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from steady.worker.contract.digests import state_digest


def apply_determinism(level: str, seed: int, threads: int) -> dict[str, Any]:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    applied: dict[str, Any] = {}
    if level in ("seeded", "strict"):
        tf.keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow seeds
        applied["framework_seeded"] = True
        applied["keras_set_random_seed"] = seed
    if level == "strict":
        tf.config.experimental.enable_op_determinism()
        applied["deterministic_algorithms"] = True
        applied["tf_op_determinism"] = True
    applied["tf_intra_op_threads"] = tf.config.threading.get_intra_op_parallelism_threads()
    applied["tf_inter_op_threads"] = tf.config.threading.get_inter_op_parallelism_threads()
    return applied


def variables_digest(variables: Any) -> str:
    entries: dict[str, Any] = {}
    for i, v in enumerate(variables):
        name = getattr(v, "path", None) or getattr(v, "name", None) or f"var{i}"
        key = f"{i:04d}:{name}"  # creation order keeps duplicate names apart
        entries[key] = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
    return state_digest(entries)


def model_digest(model: Any) -> str:
    return variables_digest(model.weights)


def optimizer_digest(optimizer: Any) -> str:
    return variables_digest(optimizer.variables)


def fingerprint() -> dict[str, Any]:
    fp: dict[str, Any] = {
        "framework": "tensorflow",
        "framework_version": tf.__version__,
        "tensorflow_version": tf.__version__,
        "keras_version": getattr(tf.keras, "__version__", None) or _keras_version(),
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    }
    try:
        build = tf.sysconfig.get_build_info()
        fp["tf_cuda_build"] = build.get("cuda_version")
        fp["tf_cudnn_build"] = build.get("cudnn_version")
    except Exception:  # noqa: BLE001 - diagnostic only
        pass
    gpus = tf.config.list_physical_devices("GPU")
    fp["cuda_available"] = bool(gpus)
    if gpus:
        fp["gpu_count"] = len(gpus)
        try:
            details = tf.config.experimental.get_device_details(gpus[0])
            fp["gpu_model"] = details.get("device_name")
            cap = details.get("compute_capability")
            if cap:
                fp["gpu_capability"] = f"{cap[0]}.{cap[1]}"
        except Exception:  # noqa: BLE001
            pass
        fp["cuda_version"] = fp.get("tf_cuda_build")
        fp["cudnn_version"] = fp.get("tf_cudnn_build")
    return fp


def _keras_version() -> str | None:
    try:
        import keras

        return keras.__version__
    except Exception:  # noqa: BLE001
        return None
