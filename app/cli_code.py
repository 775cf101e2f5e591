"""``steady submit``'s code shipping: pack the study's code, check the spec against it, upload once.

The code is the git work tree that holds the spec's folder (tracked plus untracked files git
does not ignore), or the spec's folder when it is not in git, or ``--code DIR``. Paths in the
spec (entrypoint, the command's script) are relative to the spec's folder, which becomes the
run's working directory inside the unpacked copy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import worker.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module, not the package
from app.cli_support import EXIT_USAGE, CliError


def code_root(spec_path: str, code_dir: str | None) -> tuple[str, str]:
    """(root to pack, the spec folder relative to it)."""
    spec_dir = os.path.realpath(os.getcwd() if spec_path == "-" else os.path.dirname(os.path.abspath(spec_path)))
    if code_dir:
        root = os.path.realpath(code_dir)
        if not os.path.isdir(root):
            raise CliError(f"--code {code_dir}: not a directory", EXIT_USAGE)
    else:
        root = codepack.git_root(spec_dir) or spec_dir
        root = os.path.realpath(root)
    rel = os.path.relpath(spec_dir, root)
    workdir = rel.replace(os.sep, "/") if not rel.startswith("..") else "."
    return root, workdir


def check_spec_files(workload: dict[str, Any], files: list[str], root: str, workdir: str) -> None:
    """The entrypoint's file or the command's script must be in the code, else a usage error."""
    where = os.path.normpath(os.path.join(root, workdir))
    if workload.get("entrypoint"):
        entry = str(workload["entrypoint"])
        target = codepack.entrypoint_file(entry)
        module = not entry.partition(":")[0].endswith(".py")
        if not (codepack.present(target, files, workdir) or (module and codepack.present(target, files))):
            raise CliError(f"entrypoint {entry!r}: {target} is not in the code packed from {root} (looked in {where}; "
                           "an untracked file git ignores is not shipped)", EXIT_USAGE)
    if workload.get("command"):
        script = codepack.script_of([str(a) for a in workload["command"]])
        if script is not None and not codepack.present(script, files, workdir):
            raise CliError(f"command script {script} is not in the code packed from {root} (looked in {where})",
                           EXIT_USAGE)


def ship(api: Any, spec: dict[str, Any], spec_path: str, *, code_dir: str | None, max_mb: float) -> dict[str, Any] | None:
    """Pack, check and upload the code of a spec that runs user code; returns its ``code`` entry."""
    workload = spec.get("workload")
    if not isinstance(workload, dict) or not (workload.get("entrypoint") or workload.get("command")):
        return None  # built-in workloads ship no code
    root, workdir = code_root(spec_path, code_dir)
    try:
        packed = codepack.pack(root, max_bytes=int(max_mb * 1024 * 1024))
    except codepack.CodeError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    check_spec_files(workload, packed.files, root, workdir)
    from app.cli_client import ApiError

    try:
        api.request("HEAD", f"/api/v1/code/{packed.sha256}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        api.request("PUT", f"/api/v1/code/{packed.sha256}", content=packed.data,
                    headers={"Content-Type": "application/gzip"})
    code: dict[str, Any] = {"sha256": packed.sha256, "dirty": packed.dirty, "workdir": workdir}
    if packed.git_commit:
        code["git_commit"] = packed.git_commit
    git = f", git {packed.git_commit[:10]}{' (dirty)' if packed.dirty else ''}" if packed.git_commit else ""
    print(f"code {packed.sha256[:12]}: {len(packed.files)} files, {len(packed.data) / 1024:.0f} KiB from "
          f"{Path(root)}{git}", flush=True)
    return code
