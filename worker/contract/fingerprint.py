"""Stack fingerprints.

:func:`host_fingerprint` and :func:`auto_labels` run in the agent and import no framework
(versions come from ``importlib.metadata``, NumPy's from its ``.dist-info`` folder's name, the GPU from
``nvidia-smi``).
:func:`steady.worker.inrun.frameworks.run_fingerprint` runs inside the training subprocess after the
framework is imported and records what that process actually sees.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from typing import Any


FRAMEWORK_DISTS = {
    "torch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly"),
}


def _dist_version(names: tuple[str, ...]) -> str | None:
    import importlib.metadata as md  # here: importing it is a sixth of a pure-Python run's start-up

    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def numpy_version() -> str | None:
    """The NumPy an import finds, without importing it: the imported module's version where it is imported;
    else the version in the name of the one ``numpy-<version>.dist-info`` folder beside that package (a wheel's
    layout); else its distribution's metadata."""
    if "numpy" in sys.modules:
        return str(sys.modules["numpy"].__version__)
    spec = importlib.util.find_spec("numpy")
    if spec is None:
        return None
    if spec.origin:
        folder = os.path.dirname(os.path.dirname(spec.origin))
        try:
            found = [e[len("numpy-"):-len(".dist-info")] for e in os.listdir(folder)
                     if e.startswith("numpy-") and e.endswith(".dist-info")]
        except OSError:
            found = []
        if len(found) == 1:
            return found[0]
    return _dist_version(("numpy",))


def framework_versions() -> dict[str, str]:
    """Installed (importable) frameworks and their versions, without importing them."""
    found = {}
    for module, dists in FRAMEWORK_DISTS.items():
        if importlib.util.find_spec(module) is None:
            continue
        version = _dist_version(dists)
        if version:
            found[module] = version
    return found


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def os_release() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


@lru_cache(maxsize=1)
def nvidia_smi() -> dict[str, Any]:
    """GPU model, driver and the driver's CUDA version from nvidia-smi; {} without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    info: dict[str, Any] = {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
        if rows:
            info["gpu_models"] = [r[0].strip() for r in rows]
            info["gpu_model"] = rows[0][0].strip()
            info["driver_version"] = rows[0][1].strip() if len(rows[0]) > 1 else None
        head = subprocess.run([exe], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"CUDA Version:\s*([0-9.]+)", head)
        if m:
            info["driver_cuda_version"] = m.group(1)
    except (OSError, subprocess.SubprocessError):
        return {}
    return info


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def gpu_slug(model: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return _slug(model)


def cuda_label(torch_version: str | None) -> str:
    """'cpu' or 'cuda-XX.Y' from the torch build tag (+cu121 -> cuda-12.1) or nvidia-smi."""
    gpu = nvidia_smi()
    if torch_version and "+cu" in torch_version:
        tag = torch_version.split("+cu", 1)[1]
        digits = re.match(r"\d+", tag)
        if digits and gpu:
            d = digits.group(0)
            return f"cuda-{d[:-1]}.{d[-1]}"
    if gpu.get("driver_cuda_version") and not (torch_version and "+cpu" in torch_version):
        return f"cuda-{gpu['driver_cuda_version']}"
    return "cpu"


def host_fingerprint(device: str | None = None, *, frameworks: bool = True) -> dict[str, Any]:
    """The host's stack; ``frameworks=False`` leaves out the installed frameworks' versions (a run records the
    one it uses, from the framework itself)."""
    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "os": os_release(),
        "platform": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "numpy_version": numpy_version(),
    }
    if frameworks:
        fp["frameworks"] = framework_versions()
    fp["device"] = device or "auto"
    fp.update(nvidia_smi())
    return fp


def auto_labels(device: str | None = None) -> list[str]:
    versions = framework_versions()
    # every worker runs Python: a ``framework: python`` run (code with no ML framework) asks only for this
    labels: list[str] = ["python"]
    for name, version in sorted(versions.items()):
        labels += [name, f"{name}-{version.split('+', 1)[0]}"]
    if device == "cpu":
        labels.append("cpu")
    else:
        label = cuda_label(versions.get("torch"))
        labels.append(label)
        gpu = nvidia_smi().get("gpu_model")
        if gpu and label != "cpu":
            labels.append(gpu_slug(gpu))
    return labels
