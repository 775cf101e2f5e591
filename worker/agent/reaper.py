"""A run owns its processes: the reaper between the agent and a run ends everything the run started.

A run's process group does not hold everything it starts: a daemon that double-forks and calls
``setsid`` leaves the group, and once its parent exits, the kernel hands it to init, out of the agent's
reach, where it keeps running (and writing) after its run completed. So the agent starts each run
through this small program (``python -I -S reaper.py ARGV...``, the standard library only, no site,
no ``PYTHON*`` variables, nothing of the run's ``PYTHONPATH``). It marks itself a *child subreaper*
(Linux ``PR_SET_CHILD_SUBREAPER``): an orphan anywhere below it is re-parented to it, not to init, so
every process the run started, whatever its session or group, stays in its process tree. It runs the
run's argv as its one child and waits; when that child exits it SIGKILLs whatever is left below it,
reaps it all, and exits as the child did (the same status, or killed by the same signal).

The agent, to end a run early (time limit, cancel, lost lease), kills the tree below the reaper with
:func:`end_tree` and then the process group, the reaper with it. A SIGTERM, SIGINT or SIGHUP sent to the
group (``scancel``, preemption) is the run's to handle as before; the reaper outlives it to clean up.

What is not covered: a process that the run's own user kills the reaper from (without ``--run-as`` a
run runs as the agent's user, and can signal it anyway), and a SIGKILLed agent (the reaper dies with it,
its child too by ``PR_SET_PDEATHSIG``; a daemon below is re-parented to init). A cgroup per run would
hold those; it needs a delegated cgroup tree, which an unprivileged agent rarely has.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
END_PASSES = 200  # rounds of kill-what-is-left: a process forking as fast as it is killed loses after this


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process in ``/proc``."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
        out[int(name)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes below ``root``, parents before their children."""
    procs = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, frontier = [], [root]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, ())]
        out += [p for p in frontier if procs[p][1] != "Z"]
    return out


def _reap_nowait() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_tree(root: int, *, reap: bool = False) -> int:
    """SIGKILL every process below ``root`` until none is left (at most :data:`END_PASSES` rounds); with
    ``reap`` (``root`` is this process) reap them as they die. Returns how many were killed."""
    killed = 0
    for _ in range(END_PASSES):
        pids = descendants(root)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        if reap:
            _reap_nowait()
        time.sleep(0.002)  # let the kernel re-parent the orphans of what just died
    return killed


def _exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the run dumped its core already, if at all
        except (ImportError, ValueError, OSError):
            pass
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        sig = signal.SIGKILL  # a signal that does not end a process (e.g. SIGCHLD) cannot be replayed
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


_OUTLIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _outlive(signum: int, frame: object) -> None:
    """The reaper's answer to a signal its run also got: none (it exits when the run has)."""


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: reaper.py PROGRAM [ARG...]\n")
        os._exit(2)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    # A scheduler's SIGTERM (scancel, preemption) or a Ctrl-C reaches the whole group: the run decides
    # what to do with it, and the reaper stays to end what the run leaves behind. (A handler, not
    # SIG_IGN, which the run would inherit through exec.)
    for sig in _OUTLIVED:
        signal.signal(sig, _outlive)
    me = os.getpid()
    child = os.fork()
    if child == 0:
        for sig in _OUTLIVED:
            signal.signal(sig, signal.SIG_DFL)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the run dies with its reaper
        if os.getppid() != me:
            os._exit(137)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.stderr.write(f"steady: could not start {argv[0]!r}: {exc}\n")
            sys.stderr.flush()
            os._exit(127)
    status = None
    while status is None:
        try:
            pid, st = os.waitpid(-1, 0)  # adopted orphans are reaped here as they exit
        except ChildProcessError:
            break
        if pid == child:
            status = st
    end_tree(me, reap=True)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    _exit_like(status if status is not None else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
