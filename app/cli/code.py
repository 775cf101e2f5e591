"""``steady submit``'s (and ``steady check``'s) code shipping: pack the study's code and each arm's,
check the spec against them, upload each once.

The code is the git work tree that holds the spec's folder (tracked plus untracked files git
does not ignore), or the spec's folder when it is not in git, or ``--code DIR``. Paths in the
spec (entrypoint, the command's script) are relative to the spec's folder, which becomes the
run's working directory inside the unpacked copy.

An arm's ``code: DIR`` (a folder relative to the spec) is packed the same way with DIR as the
root: its runs start at DIR's top, or in the spec's folder when that lies inside DIR.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

import steady.worker.contract.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module, not the package
from steady.server.cli.support import EXIT_USAGE, CliError


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


class _Shipper:
    """Packs and uploads the archives of one spec, each folder packed once and each digest uploaded once."""

    def __init__(self, api: Any, spec_path: str, max_mb: float, out: TextIO) -> None:
        self.api, self.spec_path, self.max_mb, self.out = api, spec_path, max_mb, out
        self.packed: dict[str, codepack.Packed] = {}
        self.uploaded: set[str] = set()
        self.pending: list[tuple[codepack.Packed, str, str]] = []

    def pack(self, root: str) -> codepack.Packed:
        if root not in self.packed:
            try:
                self.packed[root] = codepack.pack(root, max_bytes=int(self.max_mb * 1024 * 1024))
            except codepack.CodeError as exc:
                raise CliError(str(exc), EXIT_USAGE) from None
        return self.packed[root]

    def upload(self, packed: codepack.Packed) -> None:
        """PUT the archive unless the server holds it (HEAD) or this spec uploaded it already."""
        if packed.sha256 in self.uploaded:
            return
        upload_archive(self.api, packed)
        self.uploaded.add(packed.sha256)

    def ship(self, workload: dict[str, Any], root: str, workdir: str, what: str) -> dict[str, Any]:
        """Pack ``root`` and check the workload's file is in it (uploaded later, by :meth:`upload_all`,
        once every archive passed); the spec's ``code`` entry for it."""
        packed = self.pack(root)
        check_spec_files(workload, packed.files, root, workdir)
        self.pending.append((packed, what, root))
        code: dict[str, Any] = {"sha256": packed.sha256, "dirty": packed.dirty, "workdir": workdir}
        if packed.git_commit:
            code["git_commit"] = packed.git_commit
        return code

    def upload_all(self) -> None:
        for packed, what, root in self.pending:
            self.upload(packed)
            git = f", git {packed.git_commit[:10]}{' (dirty)' if packed.dirty else ''}" if packed.git_commit else ""
            print(f"{what} {packed.sha256[:12]}: {len(packed.files)} files, {len(packed.data) / 1024:.0f} KiB from "
                  f"{Path(root)}{git}", file=self.out, flush=True)


def _user_code(workload: Any) -> bool:
    return isinstance(workload, dict) and bool(workload.get("entrypoint") or workload.get("command"))


def _arm_code(shipper: _Shipper, workload: Any, i: int, arm: dict[str, Any], *, no_code: bool) -> Any:
    """An arm's ``code`` as the server takes it: a folder next to the spec is packed and uploaded
    (its digest replaces it); ``{sha256: ...}`` names an uploaded archive and is sent as it is."""
    value, name = arm["code"], arm.get("name", f"#{i + 1}")
    if isinstance(value, dict) or value is None:
        return value  # the server checks the archive is there and holds the workload's file
    spec_dir = os.getcwd() if shipper.spec_path == "-" else os.path.dirname(os.path.abspath(shipper.spec_path))
    folder = os.path.join(spec_dir, os.path.expanduser(str(value)))
    if not os.path.isdir(folder):
        raise CliError(f"arms[{i}].code {value!r} (arm {name!r}): not a folder ({folder} does not exist); give a "
                       "folder relative to the spec, to ship as the arm's code, or {sha256: <64 hex>} of an "
                       "uploaded archive", EXIT_USAGE)
    if no_code:
        raise CliError(f"arms[{i}].code (arm {name!r}) is the folder {value!r}, but --no-code ships nothing: "
                       "drop --no-code, or name an uploaded archive with {sha256: ...}", EXIT_USAGE)
    if not _user_code(workload):
        raise CliError(f"arms[{i}].code (arm {name!r}): built-in workloads ship no code", EXIT_USAGE)
    root, workdir = code_root(shipper.spec_path, folder)
    try:
        return shipper.ship(workload, root, workdir, f"arm {name} code")
    except CliError as exc:
        raise CliError(f"arms[{i}].code (arm {name!r}): {exc.message}", exc.code) from None


def ship_code(api: Any, spec: dict[str, Any], spec_path: str, *, code_dir: str | None, max_mb: float,
              no_code: bool, out: TextIO | None = None) -> None:
    """Give ``spec`` the digests of the code its runs execute (``steady submit`` and ``steady check``):
    each arm's ``code: DIR``, and the study's code unless the spec names it, ``--no-code`` is given or
    every arm runs its own. Each archive is packed and uploaded once, after all of them were checked."""
    shipper = _Shipper(api, spec_path, max_mb, out or sys.stdout)
    arms: list[Any] = spec["arms"] if isinstance(spec.get("arms"), list) else []
    for i, arm in enumerate(arms):
        if isinstance(arm, dict) and "code" in arm:
            arm["code"] = _arm_code(shipper, spec.get("workload"), i, arm, no_code=no_code)
    every_arm_own = bool(arms) and all(isinstance(a, dict) and a.get("code") for a in arms)
    if code_dir is not None and every_arm_own:  # refused, not silently ignored
        raise CliError(f"--code {code_dir}: every arm names its own code, so no run would execute it; "
                       "drop --code or give an arm no 'code'", EXIT_USAGE)
    if not (no_code or "code" in spec or every_arm_own or not _user_code(spec.get("workload"))):
        root, workdir = code_root(spec_path, code_dir)  # (built-in workloads ship no code)
        spec["code"] = shipper.ship(spec["workload"], root, workdir, "code")
    shipper.upload_all()


def ship_options(args: Any, api: Any, spec: dict[str, Any], spec_path: str, out: TextIO | None = None) -> None:
    """:func:`ship_code` with the command's ``--code``, ``--no-code`` and ``--max-code-mb``."""
    ship_code(api, spec, spec_path, code_dir=args.code, max_mb=args.max_code_mb, no_code=args.no_code, out=out)


def upload_archive(api: Any, packed: codepack.Packed) -> None:
    """PUT a code archive unless the server holds it already (HEAD answers 200)."""
    from steady.server.cli.client import ApiError

    try:
        api.request("HEAD", f"/api/v1/code/{packed.sha256}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        api.request("PUT", f"/api/v1/code/{packed.sha256}", content=packed.data,
                    headers={"Content-Type": "application/gzip"})
