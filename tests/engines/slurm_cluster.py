"""A throwaway single-node Slurm cluster on loopback, from Debian's ``slurm-wlm`` and ``munge``.

Everything lives in one temporary directory: a generated munge key and socket, the
``slurm.conf``, state, spool, logs and pid files. ``munged``, ``slurmctld`` and ``slurmd``
run in the foreground as children of this process and are stopped by :meth:`stop`.
Commands (``sbatch``, ``squeue``, ``scancel``) find the cluster through ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from steady.server.web.devserver import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _sbin(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if _sbin(b) is None]


class SlurmCluster:
    def __init__(self, root: Path, *, cpus: int | None = None) -> None:
        self.root = root
        self.cpus = cpus or os.cpu_count() or 2
        self.node = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket.2"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "MUNGE_SOCKET": str(self.munge_socket)}

    def _write_config(self) -> None:
        for d in ("munge", "state", "spool", "log", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, d_port = free_port(), free_port()
        r = self.root
        self.conf.write_text(f"""\
ClusterName=steadytest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def _spawn(self, *argv: str) -> subprocess.Popen:
        log = open(self.root / "log" / f"{Path(argv[0]).name}.out", "ab")  # noqa: SIM115
        proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 60.0) -> None:
        self._write_config()
        r = self.root
        self._spawn(_sbin("munged"), "-F", "--force", f"--key-file={r}/munge/munge.key",
                    f"--socket={self.munge_socket}", f"--pid-file={r}/run/munged.pid",
                    f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munge.seed")
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged")
        self._spawn(_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf))
        self._wait(lambda: self._ok("sinfo"), timeout, "slurmctld")
        self._spawn(_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", self.node)
        self._wait(self._node_idle, timeout, "slurmd (node idle)")

    def _ok(self, *argv: str) -> bool:
        return subprocess.run([_sbin(argv[0]), *argv[1:]], env=self.env, capture_output=True).returncode == 0

    def _node_idle(self) -> bool:
        out = subprocess.run([_sbin("sinfo"), "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip().startswith("idle")

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}:\n{self.logs()}")
            if predicate():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{self.logs()}")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([_sbin(argv[0]) or argv[0], *argv[1:]], env=self.env, capture_output=True,
                              text=True, check=check)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
