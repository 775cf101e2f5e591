"""``steady bisect GOOD BAD -- SPEC``: the first commit of the user's git history where one of Steady's own
verdicts changes, each point decided by a study on the server.

A bisect is a sequence of ordinary studies, one per point (commit): each ships that commit's code (its
content-addressed archive, ``git_commit`` set), runs on the queue and is judged by the report's one outcome
(``steady.server.reports.outcome``), the check of the bisected kind deciding the point: pass → ``good``, fail →
``bad``, inconclusive → ``undecided``; a study whose runs all failed, or a commit lacking the spec's script,
is ``skipped`` (``git bisect skip``). Seed stability and TOST points grow in stages (the spec's ``budget``,
docs/adaptive-seeds.md) within their share of ``--budget-runs``; ``--budget-minutes`` starts no point once
that many minutes have passed. Every statistical point is judged at the level
``--alpha`` / m (the spec's ``alpha``), m the most points the search may decide (``plan``), so the commit named is
wrong with probability at most ``--alpha`` while no more than m points are decided. The search is
``steady.server.stats.bisect``; each study's description names the bisect and the point, so the studies
are found on the dashboard. No table, no scheduler of its own. A repeatability break found is localized at
once: the first bad commit's diverging repeats go to a worker as a localization job (the dashboard's Localize
button's, ``steady.server.cli.localize.request_job``), and its answer is part of the bisect's (``--no-localize``
skips it).
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from steady.server.cli.support import EXIT_CANNOT_JUDGE, EXIT_USAGE, CliError, client_opts, load_spec
from steady.server.kit.terminal import printable

PROPERTIES = {  # --property → the report check kind that decides a point
    "repeatability": "repeatability",
    "seed-stability": "seed_stability",
    "tost": "stack_portability",
    "cost": "determinism_cost",
    "convergence": "convergence",
}
EXIT_FOUND, EXIT_NO_CHANGE, EXIT_UNDECIDED = 0, 1, 2
_clock = time.monotonic  # seconds; --budget-minutes reads it (a test puts its own clock here)
LOCALIZE_MINUTES = 15.0  # the longest wait for the first bad commit's localization without --budget-minutes


@dataclass(frozen=True)
class Commit:
    """A point of the history: a commit (``stack`` None), a stack of the spec's ``stacks`` (``sha`` its name), or a
    version of a package (``version`` ``(name, version)``; ``sha`` the name of the stack that pins it)."""

    sha: str
    subject: str
    stack: dict[str, Any] | None = None
    version: tuple[str, str] | None = None

    @property
    def short(self) -> str:
        if self.version is not None:
            return f"{self.version[0]} {self.version[1]}"
        return self.sha if self.stack is not None else self.sha[:10]

    @property
    def what(self) -> str:
        return "version" if self.version is not None else "stack" if self.stack is not None else "commit"

    @property
    def ident(self) -> str:
        """The point as a study's description names it: a sha, a stack's name, or NAME==VERSION."""
        return f"{self.version[0]}=={self.version[1]}" if self.version is not None else self.sha

    @property
    def named(self) -> str:
        """The point and its subject, in a sentence."""
        return f"{self.short} {self.subject}" if self.subject else self.short


def _git(repo: str, *args: str, binary: bool = False) -> Any:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        raise CliError(f"git {' '.join(args)}: {exc.stderr.decode(errors='replace').strip()}", EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"cannot run git: {exc}", EXIT_USAGE) from None
    return out.stdout if binary else out.stdout.decode("utf-8", "replace")


def history(repo: str, good: str, bad: str) -> list[Commit]:
    """GOOD, then the first-parent commits after it up to BAD (oldest first)."""
    good_sha = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}").strip()
    bad_sha = _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}").strip()
    shas = [good_sha, *_git(repo, "rev-list", "--first-parent", "--reverse", f"{good_sha}..{bad_sha}").split()]
    if len(shas) < 2 or shas[-1] != bad_sha:
        raise CliError(f"{good} is not a first-parent ancestor of {bad}: nothing to bisect", EXIT_USAGE)
    if good_sha not in _git(repo, "rev-list", "--first-parent", bad_sha).split():
        raise CliError(f"{good} is not on {bad}'s first-parent line: nothing to bisect", EXIT_USAGE)
    subjects = dict(line.split(" ", 1) for line in _git(repo, "log", "--format=%H %s", "--no-walk", *shas).splitlines()
                    if " " in line)
    return [Commit(s, subjects.get(s, "")) for s in shas]


def stack_range(spec: dict[str, Any], good: str, bad: str) -> list[Commit]:
    """GOOD … BAD among the spec's ``stacks`` (in the spec's order) when both name one, else ``[]``."""
    stacks = [s for s in spec.get("stacks") or [] if isinstance(s, dict)]
    names = [str(s.get("name")) for s in stacks]
    if good not in names or bad not in names:
        return []
    i, j = names.index(good), names.index(bad)
    if j <= i:
        raise CliError(f"stack {good} does not come before {bad} in the spec's stacks ({', '.join(names)})", EXIT_USAGE)
    return [Commit(names[k], "labels " + (", ".join(map(str, stacks[k].get("labels") or [])) or "none"), stacks[k])
            for k in range(i, j + 1)]


PIN = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._\-]*[A-Za-z0-9])?)==(?P<version>\S+)$")


def package_pins(good: str, bad: str) -> tuple[str, str, str] | None:
    """(name, GOOD's version, BAD's version) when GOOD and BAD are NAME==VERSION of one package, else None."""
    g, b = PIN.match(good), PIN.match(bad)
    if g is None and b is None:
        return None
    if g is None or b is None:
        raise CliError(f"GOOD and BAD must both be NAME==VERSION to bisect package versions (got {good} and {bad})",
                       EXIT_USAGE)
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    if canonicalize_name(g["name"]) != canonicalize_name(b["name"]):
        raise CliError(f"GOOD and BAD name two packages ({g['name']}, {b['name']}): bisect the versions of one",
                       EXIT_USAGE)
    try:
        low, high = Version(g["version"]), Version(b["version"])
    except InvalidVersion as exc:
        raise CliError(f"not a PEP 440 version: {exc}", EXIT_USAGE) from None
    if not low < high:
        raise CliError(f"GOOD {good} must be an earlier version than BAD {bad}", EXIT_USAGE)
    return g["name"], g["version"], b["version"]


def index_versions(name: str) -> list[str]:
    """The versions of ``name`` the package index offers, as pip sees it (``pip index versions``: pip's
    configuration, PIP_INDEX_URL, PIP_FIND_LINKS, --no-index; pre-releases and yanked releases left out)."""
    import json

    try:
        out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name, "--json",
                              "--disable-pip-version-check"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(f"pip index versions {name}: {exc}", EXIT_USAGE) from None
    if out.returncode != 0:
        tail = " / ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        raise CliError(f"pip index versions {name} found no versions (exit {out.returncode}): {tail}", EXIT_USAGE)
    try:
        return [str(v) for v in json.loads(out.stdout.strip().splitlines()[-1])["versions"]]
    except (ValueError, KeyError, IndexError):
        raise CliError(f"pip index versions {name}: unreadable answer {out.stdout[-300:]!r}", EXIT_USAGE) from None


def version_range(spec: dict[str, Any], name: str, good: str, bad: str,
                  versions: list[str] | None = None) -> list[Commit]:
    """GOOD, the versions of ``name`` between (from the package index), BAD, in PEP 440 order: each a stack that
    pins that version over the spec's one stack (its labels and other pins), or over none."""
    from packaging.version import Version

    stacks = [s for s in spec.get("stacks") or [] if isinstance(s, dict)]
    if len(stacks) > 1:
        raise CliError(f"a bisect over versions runs on one stack; the spec names {len(stacks)}: keep one (its labels "
                       "select the workers)", EXIT_USAGE)
    base = stacks[0] if stacks else {}
    low, high = Version(good), Version(bad)
    found = index_versions(name) if versions is None else versions
    between = sorted({Version(v) for v in found if low < Version(v) < high})
    ordered = [good, *(str(v) for v in between), bad]
    prefix = re.sub(r"[^A-Za-z0-9_.:+\-]", "-", name)
    points = []
    for v in ordered:
        stack: dict[str, Any] = {"name": f"{prefix}-{v}"[:100], "labels": list(base.get("labels") or []),
                                 "packages": {**(base.get("packages") or {}), name: v}}
        points.append(Commit(stack["name"], "", stack, (name, v)))
    return points


def pack_commit(repo: str, sha: str, scratch: str, max_mb: float) -> Any:
    """The commit's tracked files as the study's code archive (as ``steady submit`` packs a clean tree)."""
    import steady.worker.contract.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module

    dest = os.path.join(scratch, sha)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(_git(repo, "archive", "--format=tar", sha, binary=True))) as tar:
        tar.extractall(dest, filter="data")
    files = [n for n in _git(repo, "ls-tree", "-r", "-z", "--name-only", sha).split("\0") if n]
    try:
        return codepack.pack(dest, files, max_bytes=int(max_mb * 1024 * 1024))
    except codepack.CodeError as exc:
        raise CliError(f"commit {sha[:10]}: {exc}", EXIT_USAGE) from None


def command_spec(command: list[str], framework: str) -> dict[str, Any]:
    """A study spec for a bare command: two repeats of seeds 0–4 at strict (where repeats must be identical), its
    printed loss."""
    return {"name": "bisect", "workload": {"framework": framework, "command": command}, "seeds": [0, 1, 2, 3, 4],
            "repeats": 2, "determinism": ["strict"], "max_attempts": 1}


class _Bisect:
    """Turns points into studies and studies into point outcomes."""

    def __init__(self, api: Any, args: argparse.Namespace, spec: dict[str, Any], repo: str, workdir: str,
                 commits: list[Commit], scratch: str) -> None:
        self.api, self.args, self.spec, self.repo, self.workdir = api, args, spec, repo, workdir
        self.commits, self.scratch = commits, scratch
        self.kind = PROPERTIES[args.property]
        self.codes: dict[str, dict[str, Any] | str] = {}  # sha → the spec's code entry, or why it cannot run
        self.reports: dict[int, Any] = {}  # point → its study's report
        self.studies: dict[int, dict[str, Any]] = {}
        self.stacks = commits[0].stack is not None
        self.plan: Any = None  # the search's plan (``steady.server.stats.bisect.plan``), set before the first point
        self.localized: str | None = None  # the first bad commit's localization, in a line (``localize``)
        self.started = _clock()
        self.title = (f"{commits[0].sha}..{commits[-1].sha}" if self.stacks
                      else f"{commits[0].sha[:7]}..{commits[-1].sha[:7]}")

    # --- one point's study

    def per_seed_runs(self) -> int:
        s = self.spec
        arms = 2 if self.kind == "stack_portability" else 1
        return max(int(s.get("repeats", 1)), 1) * max(len(s.get("determinism") or ["seeded"]), 1) * arms

    def min_runs(self) -> int:
        return max(len(self.spec.get("seeds") or [0]), 1) * self.per_seed_runs()

    def code(self, point: int) -> dict[str, Any] | str:
        from steady.server.cli.code import check_spec_files, upload_archive

        if self.stacks:  # the working tree's code, shipped once (cmd_bisect)
            return dict(self.spec["code"]) if "code" in self.spec else {}
        sha = self.commits[point].sha
        if sha not in self.codes:
            packed = pack_commit(self.repo, sha, self.scratch, self.args.max_code_mb)
            try:
                check_spec_files(self.spec["workload"], packed.files, os.path.join(self.scratch, sha), self.workdir)
            except CliError as exc:
                self.codes[sha] = exc.message
                return self.codes[sha]
            upload_archive(self.api, packed)
            self.codes[sha] = {"sha256": packed.sha256, "dirty": False, "workdir": self.workdir, "git_commit": sha}
        return self.codes[sha]

    def study_spec(self, point: int, share: int, code: dict[str, Any]) -> dict[str, Any]:
        spec = copy.deepcopy(self.spec)
        commit = self.commits[point]
        spec["name"] = f"{str(spec.get('name', 'bisect'))[:120]} @ {commit.short} (bisect {self.title})"
        spec["description"] = (f"steady bisect {self.title} ({self.args.property}): point {point} of "
                               f"{len(self.commits) - 1}, {commit.what} {commit.ident}")
        spec.pop("budget", None)
        if self.kind == "repeatability":
            spec["repeats"] = max(int(spec.get("repeats", 1)), 2)
        seeds = len(spec.get("seeds") or [0])
        if self.kind in ("seed_stability", "stack_portability"):
            max_seeds = share // self.per_seed_runs()
            if max_seeds > seeds:
                spec["budget"] = {"max_seeds": max_seeds, "stage_seeds": seeds}
        if self.stacks:
            spec.pop("reference_stack", None)
            spec["stacks"] = [commit.stack]
            if self.kind == "stack_portability":  # GOOD's stack is the reference
                spec["stacks"] = [self.commits[0].stack, commit.stack]
                spec["reference_stack"] = self.commits[0].sha
        elif self.kind == "stack_portability":
            good = self.code(0)
            assert isinstance(good, dict)  # GOOD runs: checked before the search
            spec.pop("stacks", None)
            spec["arms"] = [{"name": f"good-{self.commits[0].sha[:7]}", "code": good},
                            {"name": f"at-{commit.sha[:7]}", "code": code}]
            spec["reference_stack"] = spec["arms"][0]["name"]
        elif code:
            spec["code"] = code
        if self.kind != "repeatability":  # the point at the plan's level, over its checks (a repeatability claim is exact)
            from steady.server.stats.bisect import checks_per_point

            spec["alpha"] = self.plan.alpha_point / checks_per_point(self.kind, spec)
            if self.kind == "convergence":  # the convergence check reads its own alpha
                spec["convergence"] = {**spec["convergence"], "alpha": spec["alpha"]}
        return spec

    def outcome(self, point: int, study: dict[str, Any]) -> Any:
        from steady.server.cli.support import get_report
        from steady.server.stats.bisect import SKIPPED, PointOutcome, decide_point

        p = study["progress"]
        runs = p.get("completed", 0) + p.get("failed", 0)
        if study["status"] == "cancelled":
            raise CliError(f"study {study['id']} (point {point}) was cancelled: the bisect stops", EXIT_CANNOT_JUDGE)
        if study["status"] == "failed":
            return PointOutcome(point, SKIPPED, runs, study["id"], study.get("status_reason") or "its runs failed")
        report = get_report(self.api, study["id"])
        self.reports[point] = report
        decided = decide_point([(c.status, c.summary) for c in report.outcome.checks
                                if c.kind == self.kind and c.status != "not_asked"],
                               failed=p.get("failed", 0), runs=runs, prop=self.args.property)
        if decided is None:
            raise CliError(f"study {study['id']} has no {self.args.property} check to decide point {point}: "
                           f"{report.outcome.reason}", EXIT_CANNOT_JUDGE)
        return PointOutcome(point, decided[0], runs, study["id"], decided[1])

    # --- the oracle the search calls

    def judge(self, points: tuple[int, ...], share: int) -> list[Any]:
        from steady.server.stats.bisect import SKIPPED, PointOutcome

        out: dict[int, Any] = {}
        pending: dict[int, int] = {}
        for point in points:
            code = self.code(point)
            if isinstance(code, str):
                out[point] = PointOutcome(point, SKIPPED, 0, None, code)
                self.say(point, out[point])
                continue
            study = self.api.post("/api/v1/studies", json=self.study_spec(point, share, code))
            self.studies[point] = study
            pending[point] = study["id"]
            self.progress(f"point {point} {self.commits[point].short}: study {study['id']}, "
                          f"up to {share} runs")
        while pending:
            for point, sid in list(pending.items()):
                study = self.api.get(f"/api/v1/studies/{sid}")
                if study["status"] in {"completed", "failed", "cancelled"}:
                    del pending[point]
                    self.studies[point] = study
                    out[point] = self.outcome(point, study)
                    self.say(point, out[point])
            if pending:
                time.sleep(self.args.poll)
        return [out[p] for p in points]

    def out_of_time(self) -> bool:
        """Whether --budget-minutes is spent (since the bisect started): no new point is started then."""
        minutes = self.args.budget_minutes
        return minutes is not None and (_clock() - self.started) / 60 >= minutes

    def progress(self, line: str) -> None:
        print(printable(line), file=sys.stderr, flush=True)

    def say(self, point: int, o: Any) -> None:
        study = f"study {o.ref}, {o.runs} runs" if o.ref is not None else "not run"
        self.progress(f"point {point} {self.commits[point].short}: {o.state} ({study}): {o.why}")


def _describe(b: _Bisect, point: int, result: Any) -> str:
    o = result.outcome(point)
    if o is None:
        return "not judged (taken as given)"
    return f"{o.state}: {o.why}" + (f" (study {o.ref}, {o.runs} runs)" if o.ref is not None else "")


def _divergent_step(b: _Bisect, point: int) -> str:
    report = b.reports.get(point)
    if report is None or b.kind != "repeatability":
        return ""
    for v in report.of_level("repeatability"):
        if v.verdict != "identical":
            step = "an unrecorded step" if v.first_divergent_step is None else f"step {v.first_divergent_step}"
            if b.localized is not None:
                return f"repeats part at {step} ({v.group.determinism})"
            return (f"repeats part at {step} ({v.group.determinism}); `steady localize {report.study.id}` "
                    "names the first divergent op")
    return ""


def localize(b: _Bisect, point: int) -> str:
    """The first divergent op at the first bad point, in a line, or why none was named: the point's diverging
    repeats are localized by a worker (the localization job of the dashboard's Localize button, as
    ``steady localize``'s pair), waited for with progress up to what is left of --budget-minutes, or
    ``LOCALIZE_MINUTES``; a job still unfinished then is cancelled."""
    from steady.server.cli.client import ApiError
    from steady.server.cli.localize import diverging_pair, follow_job, request_job

    report, at = b.reports[point], b.commits[point].short
    sid = report.study.id
    by_hand = f"`steady localize {sid}` replays the pair on this machine"
    try:
        pair = diverging_pair(report)
    except CliError as exc:
        return f"no op named at {at}: {exc.message}"
    if b.args.budget_minutes is not None:
        seconds = b.args.budget_minutes * 60 - (_clock() - b.started)
        limit = f"--budget-minutes {b.args.budget_minutes:g}"
        if seconds <= 0:
            return f"no op named at {at}: the budget of {b.args.budget_minutes:g} minutes is spent; {by_hand}"
    else:
        seconds, limit = LOCALIZE_MINUTES * 60, f"{LOCALIZE_MINUTES:g} minutes"
    try:
        job = request_job(b.api, sid, pair)
    except ApiError as exc:
        reason = re.sub(r"^body\.runs: ", "", exc.detail)
        if exc.status == 422:
            return f"no op named at {at}: {reason}"
        return (f"no op named at {at}: the localization of runs {pair[0]} and {pair[1]} was refused (HTTP "
                f"{exc.status}: {reason}); {by_hand}")
    b.progress(f"localizing the first divergent op at {at}: runs {pair[0]} and {pair[1]} of study {sid}, by a worker "
               f"(localization job {job['id']}, waiting up to {seconds / 60:.1f} minutes)")
    try:
        job = follow_job(b.api, job, seconds=seconds, poll=b.args.poll, say=b.progress, clock=_clock)
    finally:
        if job["status"] in ("pending", "running"):  # out of time, or interrupted: no worker left replaying
            b.api.post(f"/api/v1/localization-jobs/{job['id']}/cancel")
    where = f"runs {pair[0]} and {pair[1]}, localization job {job['id']}" + (
        f" on worker {job['worker_name']}" if job.get("worker_name") else "")
    if job["status"] == "done" and job.get("result"):
        result = job["result"]
        sentence = result["sentence"]
        if result["status"] == "localized" and sentence.startswith("first divergent op: "):
            return f"first divergent op at {at}: {sentence.removeprefix('first divergent op: ')} ({where})"
        return f"no op named at {at}: {sentence} ({where})"
    if job["status"] == "failed":
        return f"no op named at {at}: the localization failed: {job.get('error') or 'no reason given'} ({where})"
    if job["status"] == "cancelled":
        return f"no op named at {at}: the localization was cancelled ({where}); {by_hand}"
    return (f"no op named at {at}: the localization did not finish within {limit} ({where}, {job['status']}; "
            f"cancelled); {by_hand}")


def _paren(c: Commit) -> str:
    return f"{c.short} ({c.subject})" if c.subject else c.short


def render(b: _Bisect, result: Any) -> int:
    from steady.server.stats.bisect import BAD, GOOD, UNDECIDED

    commits = b.commits
    low, high = commits[result.last_good], commits[result.first_bad]
    out: list[str] = []
    guarantee = _guarantee(b.plan, result.decided)
    if b.kind == "repeatability":
        guarantee = (f"{result.decided} point(s) decided; a 'differs' claim is exact (two repeats differed), an "
                     "'identical' one holds for the repeats run: a break that shows rarely can hide in them")
    if result.state == "found":
        if high.version is not None:
            out += [f"first version where {b.args.property} changed: {high.short}", "",
                    f"  at the version before it, {low.short}: {_describe(b, result.last_good, result)}",
                    f"  at {high.short}: {_describe(b, result.first_bad, result)}"]
        elif b.stacks:
            out += [f"first stack where {b.args.property} changed: {high.sha} ({high.subject})", "",
                    f"  at the stack before it, {low.sha}: {_describe(b, result.last_good, result)}",
                    f"  at {high.sha}: {_describe(b, result.first_bad, result)}"]
        else:
            stat = _git(b.repo, "show", "--stat", "--format=%H%n%an, %ad%n%n    %B", high.sha).rstrip()
            out += [f"first commit where {b.args.property} changed: {high.short} {high.subject}", "",
                    *("  " + line for line in stat.splitlines()), "",
                    f"  at its parent {low.short}: {_describe(b, result.last_good, result)}",
                    f"  at {high.short}:        {_describe(b, result.first_bad, result)}"]
        step = _divergent_step(b, result.first_bad)
        if step:
            out.append(f"  {step}")
        if b.localized:
            out.append(f"  {b.localized}")
        code = EXIT_FOUND
    elif result.state == "no_change":
        ends = ", ".join(f"{'GOOD' if o.point == 0 else 'BAD'} {commits[o.point].short} is {o.state}: {o.why}"
                         for o in result.ends)
        out.append(f"no change to bisect: {ends}")
        code = EXIT_NO_CHANGE
    elif result.state == "inconsistent":
        bad_p, good_p = result.conflict
        out += [f"inconsistent: {commits[bad_p].short} is bad but the later {commits[good_p].short} is good: the "
                "property changes more than once in this range, or one of these claims is wrong; bisect a shorter range",
                f"  {commits[bad_p].short}: {_describe(b, bad_p, result)}",
                f"  {commits[good_p].short}: {_describe(b, good_p, result)}"]
        code = EXIT_NO_CHANGE
    else:
        out.append(f"undecided between {_paren(low)} and {_paren(high)}: the "
                   f"first change is one of the {result.first_bad - result.last_good} {low.what}s after {low.short}")
        for o in result.ends:
            if o.state != (BAD if o.point else GOOD):  # an end not as given
                out.append(f"  {'BAD' if o.point else 'GOOD'} {commits[o.point].named} is "
                           f"{_describe(b, o.point, result)}")
        for label, pts in (("skipped (could not run)", result.skipped), ("undecided", result.undecided)):
            for p in pts:
                out.append(f"  {label}: {commits[p].named}: {_describe(b, p, result)}")
        grew = [o for o in (*result.ends, *(result.outcome(p) for p in result.undecided))
                if o is not None and o.state == UNDECIDED]
        if grew and b.kind != "repeatability":
            most = max(o.runs for o in grew)
            which = "an undecided point ran out of its share" if len(grew) == 1 else \
                "the undecided points ran out of their shares"
            out.append(f"  {which} of the budget ({most} runs of --budget-runs {b.args.budget_runs}) before the "
                       "check decided: raise --budget-runs")
        if result.budget_spent:
            out.append(f"  the budget of {b.args.budget_runs} runs is spent ({result.runs} used): raise --budget-runs")
        if result.time_spent:
            used = (_clock() - b.started) / 60
            out.append(f"  the budget of {b.args.budget_minutes:g} minutes is spent ({used:.1f} minutes used): no "
                       "point was started after it; raise --budget-minutes")
        code = EXIT_UNDECIDED
    rounds = len(result.rounds) + bool(result.ends)
    out.append(f"steady bisect {b.title}: {result.state} (exit {code}); {rounds} round(s), {result.runs} runs; "
               f"{guarantee}")
    out.append(f"dashboard: {b.api.server}/bisects/{b.title}")
    print("\n".join(printable(line) for line in out))
    return code


def cmd_bisect(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api
    from steady.server.stats.bisect import bisect, plan

    target = _split_target(args)
    if args.budget_runs < 1 or args.parallel < 1:
        raise CliError("--budget-runs and --parallel must be 1 or more", EXIT_USAGE)
    if args.budget_minutes is not None and not args.budget_minutes > 0:
        raise CliError(f"--budget-minutes must be more than 0, got {args.budget_minutes:g}", EXIT_USAGE)
    if not 0.0 < args.alpha <= 0.5:
        raise CliError(f"--alpha must be in (0, 0.5], got {args.alpha:g}", EXIT_USAGE)
    if not target:
        raise CliError("give a study spec or a command after --", EXIT_USAGE)
    if len(target) == 1 and os.path.isfile(target[0]):
        spec, spec_dir = load_spec(target[0]), os.path.dirname(os.path.abspath(target[0]))
    else:
        spec, spec_dir = command_spec(target, args.framework), os.getcwd()
    commits = stack_range(spec, args.good, args.bad)  # GOOD and BAD name stacks of the spec: a stack range
    pins = None if commits else package_pins(args.good, args.bad)
    if pins is not None:  # NAME==A NAME==B: the versions between, from the package index
        commits = version_range(spec, *pins)
    user_code = isinstance(spec.get("workload"), dict) and bool(spec["workload"].get("command")
                                                                or spec["workload"].get("entrypoint"))
    if not commits and not user_code:
        raise CliError("a bisect over commits runs your own code: the spec's workload needs a command or an "
                       "entrypoint (GOOD and BAD naming two of the spec's stacks, or NAME==VERSION of one package, "
                       "bisect those instead)", EXIT_USAGE)
    metrics = [m for m in spec.get("metrics") or [] if isinstance(m, dict)]
    if args.property == "seed-stability" and not any(m.get("max_std") for m in metrics):
        raise CliError("--property seed-stability needs a metric with max_std in the spec", EXIT_USAGE)
    if args.property == "tost" and not any(m.get("margin") for m in metrics):
        raise CliError("--property tost needs a metric with a margin in the spec", EXIT_USAGE)
    if args.property == "cost" and not (spec.get("cost_budget") and len(spec.get("determinism") or []) >= 2):
        raise CliError("--property cost needs cost_budget and two determinism levels in the spec", EXIT_USAGE)
    if args.property == "convergence" and not isinstance(spec.get("convergence"), dict):
        raise CliError("--property convergence needs convergence in the spec (metric, target, direction, "
                       "reference: docs/spec.md)", EXIT_USAGE)
    import steady.worker.contract.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module

    api = Api(args.server, args.token)
    repo, workdir = "", "."
    if commits:
        if user_code:  # the working tree's code, as `steady submit` ships it, for every stack
            from steady.server.cli.code import ship_code

            ship_code(api, spec, target[0], code_dir=None, max_mb=args.max_code_mb, no_code=False, out=sys.stderr)
    else:
        if not args.repo and not codepack.git_root(spec_dir):
            raise CliError(f"{spec_dir} is not in a git repository: give --repo", EXIT_USAGE)
        repo = os.path.realpath(args.repo or codepack.git_root(spec_dir) or "")
        rel = os.path.relpath(os.path.realpath(spec_dir), repo)
        workdir = "." if rel.startswith("..") else rel.replace(os.sep, "/")
        commits = history(repo, args.good, args.bad)
    with tempfile.TemporaryDirectory(prefix="steady-bisect-") as scratch:
        b = _Bisect(api, args, spec, repo, workdir, commits, scratch)
        if b.kind == "stack_portability" and isinstance(b.code(0), str):
            raise CliError(f"GOOD {commits[0].short} cannot be the reference: {b.code(0)}", EXIT_USAGE)
        judge_good = b.kind != "stack_portability"  # TOST: GOOD is the reference, not a point
        p = b.plan = plan(len(commits), parallel=args.parallel, budget_runs=args.budget_runs, alpha=args.alpha,
                          judge_ends=1 + judge_good)
        level = "" if b.kind == "repeatability" else f"; {planned_guarantee(p)}"
        if pins is not None:
            b.progress(f"{pins[0]} versions from the package index (pip index versions), GOOD to BAD: "
                       + ", ".join(c.version[1] for c in commits if c.version is not None))
        b.progress(f"bisecting {len(commits) - 2} {commits[0].what}s between {commits[0].short} and "
                   f"{commits[-1].short} "
                   f"for {args.property}: at most {p.rounds} rounds of {args.parallel} point(s) and the ends, "
                   f"up to {args.budget_runs // p.max_decided} runs per point"
                   + (f", no point started after {args.budget_minutes:g} minutes" if args.budget_minutes else "")
                   + level)
        result = bisect(len(commits), b.judge, parallel=args.parallel, budget_runs=args.budget_runs,
                        alpha_point=p.alpha_point, min_runs=b.min_runs(), judge_good=judge_good,
                        out_of_time=b.out_of_time)
        if (result.state == "found" and b.kind == "repeatability" and not args.no_localize
                and result.first_bad in b.reports):
            b.localized = localize(b, result.first_bad)
        return render(b, result)


def _pct(level: float) -> str:
    return f"{level * 100:.3g}%"


def planned_guarantee(p: Any) -> str:
    """The search's promise before it starts: each point's level and the chance of naming a wrong commit."""
    return (f"each point's claim at level {_pct(p.alpha_point)} ({_pct(p.alpha)} over the {p.max_decided} points "
            f"the search decides when none is skipped or undecided): wrong commit with probability ≤ {_pct(p.alpha)}")


def _guarantee(p: Any, decided: int) -> str:
    """What the search that ran can claim: m·α_point for its m decided points (Bonferroni), and how that stands
    against the plan's total when undecided or skipped points made it decide more than planned."""
    from steady.server.stats.bisect import wrong_point_bound

    bound = wrong_point_bound(decided, p.alpha_point)
    over = (f"; skipped or undecided points made it decide more than the {p.max_decided} planned, so above the "
            f"planned {_pct(p.alpha)}" if decided > p.max_decided else "")
    return (f"{decided} point(s) decided, each point's claim wrong with probability ≤ {_pct(p.alpha_point)}: the "
            f"answer is wrong with probability ≤ {_pct(bound)} (Bonferroni{over})")


def _options(p: argparse.ArgumentParser, default: Any = None) -> None:
    """The options, given before GOOD BAD or between them and ``--`` (``default``: SUPPRESS to parse the latter)."""
    def d(value: Any) -> Any:
        return value if default is None else default

    p.add_argument("--property", choices=sorted(PROPERTIES), default=d("repeatability"),
                   help="what to bisect (default repeatability)")
    p.add_argument("--budget-runs", type=int, default=d(400), help="runs for the whole bisect (default 400)")
    p.add_argument("--budget-minutes", type=float, metavar="M", default=d(None),
                   help="start no point after M minutes of the bisect; say what is known then (default: no limit)")
    p.add_argument("--parallel", type=int, default=d(1), help="points judged at once, one study each (default 1)")
    p.add_argument("--alpha", type=float, default=d(0.05),
                   help="the chance of naming a wrong commit the bisect may take (default 0.05): each point is "
                        "judged at this over the most points the search decides")
    p.add_argument("--repo", metavar="DIR", default=d(None),
                   help="the git repository (default: the one holding the spec)")
    p.add_argument("--framework", default=d("python"), help="the framework of a bare command (default python)")
    p.add_argument("--max-code-mb", type=float, default=d(50.0), help="refuse a commit's code over this (default 50)")
    p.add_argument("--no-localize", action="store_true", default=d(False),
                   help="for a repeatability break, do not ask a worker for the first divergent op at the commit found "
                        "(by default it does, and waits up to what is left of --budget-minutes, or "
                        f"{LOCALIZE_MINUTES:g} minutes)")
    p.add_argument("--poll", type=float, default=d(1.0), help=argparse.SUPPRESS)


def _split_target(args: argparse.Namespace) -> list[str]:
    """What follows ``--``; options between BAD and ``--`` are parsed into ``args``."""
    target = list(args.target)
    if "--" in target:
        cut = target.index("--")
        head, target = target[:cut], target[cut + 1:]
        if head:
            inner = argparse.ArgumentParser(prog="steady bisect GOOD BAD", add_help=False)
            client_opts(inner)
            _options(inner, argparse.SUPPRESS)
            try:
                inner.parse_args(head, namespace=args)
            except SystemExit:
                raise CliError(f"options before --: {' '.join(head)}", EXIT_USAGE) from None
    return target


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bisect", help="the first commit between GOOD and BAD where a verdict changes (one study per point)",
        description="Bisect the first-parent commits of your git repository between GOOD and BAD for the first "
                    "one where a Steady verdict changes: repeatability (identical → not), seed stability, a TOST "
                    "against GOOD's distribution, the cost of determinism, or convergence against the spec's "
                    "reference. Each point is a study of that commit's "
                    "code, decided by the server's rules; points that cannot run are skipped; a point left "
                    "undecided is said, never guessed. When GOOD and BAD name two of the spec's stacks, the stacks "
                    "from GOOD to BAD in the spec's order are bisected instead (the working tree's code on each); when they "
                    "are NAME==VERSION of one package, the versions between that pip's index offers, each pinned in "
                    "the stack the workers install. docs/bisect.md.",
        epilog="Exit codes: 0 the first commit was found; 1 no change (GOOD is not good or BAD not bad) or the "
               "claims contradict one another; 2 undecided (the budget or undecided/skipped points leave a range); "
               "3 could not judge (arguments, git, the server).")
    client_opts(p)
    p.add_argument("good", metavar="GOOD", help="a commit where the property holds (as git names it), a stack of "
                   "the spec, or NAME==VERSION of a package")
    p.add_argument("bad", metavar="BAD", help="a later commit (stack, NAME==VERSION) where it does not")
    _options(p)
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="-- SPEC | COMMAND",
                   help="a study spec (YAML/JSON) or a command with {seed}, after --")
    p.set_defaults(func=cmd_bisect, error_exit=EXIT_CANNOT_JUDGE)
