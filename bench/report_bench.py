"""Benchmark: time and server memory of a study's report, its full-resolution bands and the
dashboard's first chart, at 100 × 10^5 and 300 × 10^5 (runs × steps), before and after.

For each size a SQLite study is built once (series written with
``steady.server.metrics.repository.insert_chunks``, 10^4 points per chunk as a worker streams them). Then,
for each code version — "before" (a ``git archive`` of ``--before-ref``, default the merge base
with ``main``) and "after" (this checkout) — and for each request, a fresh single-process
``steady serve`` is started on that database with the report cache off (so every request is
cold; a server on a database that holds results imports scipy's statistics as it starts) and
measured:

* ``seconds``: the client's time for the whole response (server on loopback), and
  ``first_byte_s`` (time to the response headers);
* ``server_cpu_s``: the server process's CPU time (user + system, ``/proc/<pid>/stat``) for the
  request — on a shared, loaded machine wall time stretches with the load, CPU time much less;
* ``peak_rss_increase_bytes``: the server's peak resident memory (``VmHWM`` of
  ``/proc/<pid>/status``) minus its resident memory just before the request, and that increase
  as a multiple of the raw data (runs × steps × 8 bytes).

``/bands`` is then asked ``--repeat`` more times in the same process (warm) and its median kept.
Right before each request the bench reads the same chunks itself (sqlite3 and ``np.frombuffer``
into one ``runs × steps`` matrix, median of 3): each time is also given as a multiple of that
NumPy read (``over_numpy_read``, ``warm_over_numpy_read``), which the load on the machine
stretches alike.
Writes ``bench/results/report.json``. Run: ``.venv/bin/python bench/report_bench.py``
(``--sizes 100x100000,300x100000``; the "before" code needs only git).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from steady.server.web.devserver import ServerProcess, serve_argv  # noqa: E402
from bench.common import free_port, write_result  # noqa: E402

CHUNK = 10_000
PACKAGE_FOLDERS = {"server": "app", "worker": "worker", "migrations": "migrations"}  # pyproject.toml's package-dir
REQUESTS = ("report", "bands", "chart")
# Also measurable (``--requests``): /bands asked right after the report in the same process,
# which serves the report's band instead of loading and computing it again.
EXTRA_REQUESTS = ("bands_after_report",)


def build_study(url: str, runs: int, steps: int) -> int:
    from steady.server.kit import migrate
    from steady.server.kit.auth import Role
    from steady.server.kit.config import Settings
    from steady.server.kit.db import Database
    from steady.server.metrics.repository import insert_chunks
    from steady.server.models import Run, utcnow
    from steady.server.studies.schemas import StudySpec
    from steady.server.studies.service import create_study

    db = Database(url)
    migrate.upgrade(db.engine)
    rng = np.random.default_rng(20261129)
    with db.write() as session:
        spec = StudySpec(name=f"bench: {runs} runs × {steps} steps", kind="external",
                         metrics=[{"name": "loss", "max_std": 0.05}])
        bench_caller = SimpleNamespace(token_id=None, name="bench", role=Role.admin)
        study_id = create_study(session, spec, Settings(database_url=url), bench_caller).id
    x = np.arange(steps, dtype=np.int64)
    base = np.exp(-x / (steps / 6))
    for seed in range(runs):
        values = base + 0.02 * np.sin(x / 900 + seed) * np.exp(-x / steps) + rng.normal(0, 1e-3, steps)
        with db.write() as session:
            now = utcnow()
            run = Run(study_id=study_id, seed=seed, repeat=0, determinism="seeded", stack="a100-cu121",
                      framework="external", required_labels=[], status="completed", attempt=1, max_attempts=1,
                      fingerprint={"name": "a100-cu121"}, digests={"initial_weights": f"{seed:064x}"},
                      final_metrics={"loss": float(values[-1])}, started_at=now, finished_at=now)
            session.add(run)
            session.flush()
            for seq, lo in enumerate(range(0, steps, CHUNK)):
                insert_chunks(session, run.id, 1, seq, [("loss", x[lo:lo + CHUNK], values[lo:lo + CHUNK])])
    db.dispose()
    return study_id


def checkout(ref: str, into: Path) -> Path:
    """The code of ``ref`` in a fresh directory (``git archive``; no worktree is touched)."""
    archive = into / "src.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), ref], cwd=REPO, check=True)
    src = into / "src"
    src.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    # The installed (editable) steady maps steady.server, steady.worker and steady.migrations to this
    # checkout's folders; with these links the archive's own steady/ finds its own code first.
    for name, folder in PACKAGE_FOLDERS.items():
        (src / "steady" / name).symlink_to(src / folder, target_is_directory=True)
    return src


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (all its threads): the server's own work,
    which a loaded machine stretches in wall time but not in CPU time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


class Serve:
    """A single-process ``steady serve`` of the code in ``src`` (the process that answers is ``pid``)."""

    def __init__(self, src: Path, url: str, workdir: Path) -> None:
        self.src, self.port = src, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
        self.env.update({"STEADY_DATA_DIR": str(workdir), "STEADY_DATABASE_URL": url, "PYTHONPATH": str(src),
                         "STEADY_REPORT_CACHE_INTERVAL_SECONDS": "0"})
        self.log = workdir / "server.log"

    def __enter__(self) -> Serve:
        self.proc = ServerProcess(serve_argv(self.port, workers=1), url=self.base, log_path=self.log, env=self.env,
                                  cwd=self.src, start_timeout=120, stop_timeout=30).start()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stop()


def timed_get(client: httpx.Client, url: str) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    with client.stream("GET", url) as r:
        first = time.perf_counter() - t0
        size = sum(len(b) for b in r.iter_raw())
        if r.status_code != 200:
            raise RuntimeError(f"GET {url}: {r.status_code}")
    return time.perf_counter() - t0, first, size


def path_of(kind: str, study_id: int) -> str:
    return {"report": f"/api/v1/studies/{study_id}/report",
            "bands": f"/api/v1/studies/{study_id}/bands?metric=loss",
            "bands_after_report": f"/api/v1/studies/{study_id}/bands?metric=loss",
            "chart": f"/dashboard/data/studies/{study_id}/chart?metric=loss&determinism=seeded&stack=a100-cu121"}[kind]


def numpy_read_s(url: str, runs: int, steps: int, repeat: int = 3) -> float:
    """The baseline: the same chunks read straight into one ``runs × steps`` matrix with sqlite3 and
    ``np.frombuffer`` in this process (no server, no statistics); the median of ``repeat`` reads."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        con = sqlite3.connect(url.removeprefix("sqlite:///"))
        matrix = np.empty((runs, steps), dtype=np.float64)
        row_of: dict[int, int] = {}
        for run_id, step_min, n, values in con.execute(
                'SELECT run_id, step_min, n, "values" FROM metric_chunks WHERE key = ?', ("loss",)):
            row = row_of.setdefault(run_id, len(row_of))
            matrix[row, step_min:step_min + n] = np.frombuffer(values, dtype="<f8")
        con.close()
        times.append(time.perf_counter() - t0)
        assert len(row_of) == runs
        del matrix
    return statistics.median(times)


def measure(src: Path, url: str, token: str, study_id: int, kind: str, raw: int, repeat: int, workdir: Path) -> dict:
    with Serve(src, url, workdir) as srv, httpx.Client(base_url=srv.base, timeout=600,
                                                       headers={"Authorization": f"Bearer {token}"}) as client:
        client.get(f"/api/v1/studies/{study_id}").raise_for_status()  # warm: imports, connection, auth
        if kind == "bands_after_report":
            client.get(path_of("report", study_id)).raise_for_status()
        before, cpu0 = _status_kb(srv.proc.pid, "VmRSS"), _cpu_seconds(srv.proc.pid)
        seconds, first, size = timed_get(client, path_of(kind, study_id))
        peak, cpu = _status_kb(srv.proc.pid, "VmHWM"), _cpu_seconds(srv.proc.pid) - cpu0
        out = {"seconds": seconds, "first_byte_s": first, "server_cpu_s": cpu, "response_bytes": size,
               "load_average": os.getloadavg()[0], "rss_before_bytes": before,
               "peak_rss_bytes": peak, "peak_rss_increase_bytes": peak - before,
               "peak_increase_over_raw": (peak - before) / raw}
        if kind.startswith("bands") and repeat:
            warm, warm_cpu = [], []
            for _ in range(repeat):
                cpu0 = _cpu_seconds(srv.proc.pid)
                warm.append(timed_get(client, path_of(kind, study_id))[0])
                warm_cpu.append(_cpu_seconds(srv.proc.pid) - cpu0)
            out.update({"warm_seconds": warm, "warm_median_s": statistics.median(warm),
                        "warm_server_cpu_s": warm_cpu, "warm_median_server_cpu_s": statistics.median(warm_cpu)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100x100000,300x100000", help="runs×steps, comma separated")
    parser.add_argument("--before-ref", default="", help="git ref of the 'before' code (default: merge base with main)")
    parser.add_argument("--no-before", action="store_true", help="measure this checkout only")
    parser.add_argument("--repeat", type=int, default=3, help="warm /bands requests after the cold one")
    parser.add_argument("--out", default="report")
    parser.add_argument("--requests", default=",".join(REQUESTS + EXTRA_REQUESTS),
                        help=f"comma separated, of {', '.join(REQUESTS + EXTRA_REQUESTS)}")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="steady-report-bench-"))
    versions = {"after": REPO}
    ref = None
    if not args.no_before:
        ref = args.before_ref or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=REPO, capture_output=True,
                                                text=True, check=True).stdout.strip()
        versions = {"before": checkout(ref, tmp), "after": REPO}
    requests = tuple(args.requests.split(","))
    results = []
    for size in args.sizes.split(","):
        runs, steps = (int(v) for v in size.lower().split("x"))
        url = f"sqlite:///{tmp}/study-{runs}x{steps}.db"
        t0 = time.perf_counter()
        study_id = build_study(url, runs, steps)
        build_s = time.perf_counter() - t0
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("STEADY_")},
               "STEADY_DATABASE_URL": url, "STEADY_DATA_DIR": str(tmp)}
        token = subprocess.run([sys.executable, "-m", "steady.server.cli", "token", "create", "--role", "user", "--quiet"],
                               cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
        raw = runs * steps * 8
        entry = {"runs": runs, "steps": steps, "raw_bytes": raw, "build_s": build_s}
        for name, src in versions.items():
            entry[name] = {}
            for kind in requests:
                base = numpy_read_s(url, runs, steps)  # right before the request: the same load on the machine
                m = entry[name][kind] = measure(src, url, token, study_id, kind, raw, args.repeat, tmp)
                m["numpy_read_s"] = base
                m["over_numpy_read"] = m["seconds"] / base
                if "warm_median_s" in m:
                    m["warm_over_numpy_read"] = m["warm_median_s"] / base
                print(f"{runs}x{steps} {name:6s} {kind:6s} {m['seconds']:7.2f} s (first byte {m['first_byte_s']:.2f} s,"
                      f" server CPU {m['server_cpu_s']:.2f} s, load {m['load_average']:.0f})"
                      f"  peak +{m['peak_rss_increase_bytes'] / 2**20:7.0f} MiB = {m['peak_increase_over_raw']:.2f}× raw"
                      + (f"  warm median {m['warm_median_s']:.2f} s" if "warm_median_s" in m else "")
                      + f"  NumPy read of the chunks {base:.3f} s: ×{m['over_numpy_read']:.1f}"
                      + (f" (warm ×{m['warm_over_numpy_read']:.1f})" if "warm_over_numpy_read" in m else ""), flush=True)
        if "before" in entry:
            entry["after_over_before"] = {
                kind: {"seconds": entry["after"][kind]["seconds"] / entry["before"][kind]["seconds"],
                       "server_cpu_s": entry["after"][kind]["server_cpu_s"] / entry["before"][kind]["server_cpu_s"],
                       "peak_rss_increase": entry["after"][kind]["peak_rss_increase_bytes"]
                       / max(1, entry["before"][kind]["peak_rss_increase_bytes"])}
                for kind in requests}
        Path(url.removeprefix("sqlite:///")).unlink()
        results.append(entry)
    path = write_result(args.out, {
        "benchmark": "report, full-resolution bands and the dashboard's first chart: time and server peak memory",
        "before_ref": ref, "backend": "sqlite", "chunk_points": CHUNK,
        "targets": {"bands_300x1e5_seconds": 1.0, "peak_increase_over_raw": 2.5},
        "results": results})
    print(f"→ {path}")


if __name__ == "__main__":
    main()
