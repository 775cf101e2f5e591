"""A run trained by several local processes: the environment each rank gets, where its files go, the
``torchrun`` commands the worker runs itself, and the per-rank record a multi-process run reports.

The worker plays ``torchrun --standalone``: for ``distributed: {nproc: N}`` (or a command that starts with
``torchrun --nproc-per-node N``) the driver (:mod:`steady.worker.inrun.distributed`) starts N copies of
the code, each with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
(127.0.0.1) and ``MASTER_PORT`` (a free port) set, so ``torch.distributed.init_process_group()`` reads
them as it reads torchrun's. Rank 0 is the run: its output is captured, its events are the run's. Every
rank records the digests of its own state (:mod:`steady.worker.inrun.rankstate`) into its own event file;
:func:`summarize` puts them in one record, the run's ``distributed`` digest, which the report reads to
name the distributed layer (``steady.server.stats.distributed``).

Plain Python only: the agent and the server import this without torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

PLAN_ENV = "STEADY_DISTRIBUTED_PLAN"  # the driver's plan (JSON), set by the runner
BACKEND_ENV = "STEADY_DIST_BACKEND"  # the backend the study asked for (the code passes its own to init)
RANK_ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
RANKS_DIR = "ranks"
DRIVER_MODULE = "steady.worker.inrun.distributed"
MAX_STEPS = 1024  # per-step digests a rank keeps (the first ones: the first difference is what counts)
TORCHRUN = ("torchrun",)
TORCHRUN_MODULE = ("-m", "torch.distributed.run")


class TorchrunError(ValueError):
    """A torchrun command the worker cannot run for the user (an option it does not play)."""


def rank_env(rank: int, nproc: int, port: int, backend: str, run_id: str) -> dict[str, str]:
    """What ``torchrun --standalone --nproc-per-node nproc`` sets for ``rank`` on one node."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id, BACKEND_ENV: backend}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the OS picks it): never a fixed one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_events(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, RANKS_DIR, f"rank-{rank}.events.jsonl")


def rank_log(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, RANKS_DIR, f"rank-{rank}.log")


_NPROC = ("--nproc-per-node", "--nproc_per_node")
_IGNORED_FLAGS = ("--standalone", "--no-python", "--no_python")  # --no-python: the script is a program


def torchrun_launch(command: Sequence[str]) -> tuple[int, list[str]] | None:
    """``(nproc, argv of one rank)`` for a command that starts with ``torchrun`` (or ``python -m
    torch.distributed.run``), None for any other command. The worker runs such a command itself, as
    ``distributed: {nproc}`` with the script (``python`` first unless ``--no-python``); it plays one node,
    ``--standalone``: :class:`TorchrunError` names an option it does not play (``--nnodes`` other than 1,
    ``--rdzv-*``, ``--master-port``: the worker picks a free port itself)."""
    argv = list(command)
    if argv[:1] == list(TORCHRUN):
        rest = argv[1:]
    elif len(argv) >= 3 and argv[0] in ("python", "python3") and tuple(argv[1:3]) == TORCHRUN_MODULE:
        rest = argv[3:]
    else:
        return None
    nproc, no_python, i = None, False, 0
    while i < len(rest) and rest[i].startswith("-"):
        opt, eq, value = rest[i].partition("=")
        if opt in _IGNORED_FLAGS:
            no_python = no_python or opt in ("--no-python", "--no_python")
            i += 1
            continue
        if opt in (*_NPROC, "--nnodes"):
            if not eq:
                if i + 1 >= len(rest):
                    raise TorchrunError(f"torchrun option {opt} needs a value")
                value, i = rest[i + 1], i + 1
            if opt == "--nnodes":
                if value not in ("1", "1:1"):
                    raise TorchrunError(f"torchrun --nnodes {value}: the worker runs one node (--nnodes 1)")
            else:
                try:
                    nproc = int(value)
                except ValueError:
                    raise TorchrunError(f"torchrun {opt} {value!r}: give the number of processes "
                                        "(2 to 8); 'gpu', 'cpu' and 'auto' depend on the worker") from None
            i += 1
            continue
        raise TorchrunError(f"torchrun option {opt} is not supported: the worker runs the command as "
                            "'torchrun --standalone --nproc-per-node N' on one node, on a free port of its own "
                            "(options it plays: --nproc-per-node, --nnodes 1, --standalone, --no-python)")
    if nproc is None:
        raise TorchrunError("torchrun without --nproc-per-node: give the number of processes (2 to 8)")
    if not 2 <= nproc <= 8:
        raise TorchrunError(f"torchrun --nproc-per-node {nproc}: a distributed run has 2 to 8 processes")
    script = rest[i:]
    if not script:
        raise TorchrunError("torchrun with no script to run")
    return nproc, script if no_python else ["python", *script]


def fingerprint_digest(fingerprint: Mapping[str, Any] | None) -> str | None:
    """A short digest of a rank's stack fingerprint (ranks of one run should agree on it)."""
    if not fingerprint:
        return None
    blob = json.dumps(fingerprint, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def summarize(world_size: int, backend: str, ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's ``distributed`` record from what each rank reported: per rank its exit status, the
    digest of its fingerprint, its weight digests and its state record (the named state after the first
    synchronisation, and per step the digests of the gradients it computed and of the gradients the
    optimizer stepped with). ``ranks``: one mapping per rank with ``rank``, ``rc``, ``fingerprint``,
    ``digests`` (kind -> value, as its events gave them)."""
    out = []
    for r in sorted(ranks, key=lambda r: int(r["rank"])):
        digests: Mapping[str, Any] = r.get("digests") or {}
        raw_state = digests.get("rank_state")
        state: Mapping[str, Any] = raw_state if isinstance(raw_state, Mapping) else {}
        raw_steps = state.get("steps")
        steps: list[Any] = raw_steps if isinstance(raw_steps, list) else []
        out.append({
            "rank": int(r["rank"]), "rc": r.get("rc"), "fingerprint": fingerprint_digest(r.get("fingerprint")),
            "initial_weights": digests.get("initial_weights"), "final_weights": digests.get("final_weights"),
            "named_state": state.get("named_state"), "named_final": state.get("named_final"),
            "model": state.get("model"), "steps": [list(map(str, s))[:2] for s in steps[:MAX_STEPS]],
        })
    return {"world_size": int(world_size), "backend": backend, "ranks": out}
