"""``steady launch slurm|k8s STUDY``: start agents for a study on the scheduler a team already runs.

The engine only starts agents; the leases decide which run goes where. The launch is
recorded on the server (``POST /api/v1/studies/{id}/launches``) so ``steady status`` shows
the engine's job id.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from steady.server.cli.support import client_opts
from steady.server.kit.terminal import printable

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def register(sub: Any) -> None:
    """Add ``launch slurm`` and ``launch k8s`` to ``steady``'s subcommands."""
    p = sub.add_parser("launch", help="start agents for a study on Slurm (job array) or Kubernetes (Indexed Job)")
    engines = p.add_subparsers(dest="engine", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        client_opts(q)
        q.add_argument("study", type=int)
        q.add_argument("--worker-token", default=os.environ.get("STEADY_WORKER_TOKEN"),
                       help="token (role worker) the agents use (env STEADY_WORKER_TOKEN)")
        q.add_argument("--agent-server", help="server URL as the agents reach it (default: --server)")
        q.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                       help="extra argument for each `steady worker` (repeatable), e.g. --worker-arg=--labels=a100")

    s = engines.add_parser("slurm", help="submit one job array of agents with sbatch")
    common(s)
    s.add_argument("--tasks", type=int, required=True, help="array tasks, i.e. agents")
    s.add_argument("--gpus-per-task", type=int, default=1, help="GPUs Slurm binds to each task (0: CPU only)")
    s.add_argument("--cpus-per-task", type=int, default=2)
    s.add_argument("--partition")
    s.add_argument("--time", help="time limit of each task, Slurm's format (e.g. 4:00:00)")
    s.add_argument("--mem")
    s.add_argument("--account")
    s.add_argument("--output-dir", default=".", help="where the batch script and the tasks' logs go")
    s.add_argument("--agent-command", default="",
                   help="how a compute node starts an agent (default: this Python's `-m steady.worker`)")
    s.add_argument("--grace", type=float, default=20.0,
                   help="seconds an agent lets its run finish on scancel/preemption before releasing it "
                        "(keep under the cluster's KillWait, 30 s by default)")
    s.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                   help="a further #SBATCH option, verbatim (repeatable)")
    s.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")
    s.set_defaults(func=cmd_slurm)

    k = engines.add_parser("k8s", help="write (or --apply) an Indexed Job of agents")
    common(k)
    k.add_argument("--parallelism", type=int, required=True, help="pods, i.e. agents")
    k.add_argument("--gpu", type=int, default=1, help="nvidia.com/gpu per pod (0: CPU only)")
    k.add_argument("--image", required=True, help="container image with steady[worker] and the frameworks")
    k.add_argument("--namespace", default="default")
    k.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help="node label the pods must match (repeatable): pins the stack, e.g. GPU model")
    k.add_argument("--token-secret", default="steady-worker-token", help="Secret holding the worker token (key: token)")
    k.add_argument("--with-secret", action="store_true",
                   help="also write/create that Secret from --worker-token (else create it yourself)")
    k.add_argument("--backoff-limit", type=int, default=6)
    k.add_argument("--cpu", default="2")
    k.add_argument("--memory", default="8Gi")
    k.add_argument("--job-name", default="", help="default steady-study-STUDY")
    k.add_argument("-o", "--output", default="-", help="file for the manifest (default: stdout)")
    k.add_argument("--apply", action="store_true", help="create it in the cluster with the official client")
    k.set_defaults(func=cmd_k8s)


def _study_to_launch(api: Any, study_id: int) -> dict[str, Any]:
    """The study, once the server said the caller may launch for it: before any job exists, so a refused
    launch (another user's study: 403) leaves nothing running on the cluster."""
    api.get(f"/api/v1/studies/{study_id}/launches/permission")
    return api.get(f"/api/v1/studies/{study_id}")


def _record(api: Any, study_id: int, engine: str, job_id: str, tasks: int, detail: dict[str, Any]) -> None:
    api.post(f"/api/v1/studies/{study_id}/launches",
             json={"engine": engine, "job_id": job_id, "tasks": tasks, "detail": detail})


def cmd_slurm(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api
    from steady.server.engines import slurm

    api = Api(args.server, args.token)
    try:
        launch = slurm.SlurmLaunch(
            study_id=args.study, server=args.agent_server or api.server, tasks=args.tasks,
            gpus_per_task=args.gpus_per_task, cpus_per_task=args.cpus_per_task, partition=args.partition,
            time=args.time, mem=args.mem, account=args.account, output_dir=args.output_dir,
            agent_command=args.agent_command, worker_args=tuple(args.worker_arg), extra_sbatch=tuple(args.sbatch_option),
            grace_s=args.grace,
        )
    except slurm.LaunchError as exc:
        print(f"steady launch slurm: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(slurm.batch_script(launch), end="")
        return EXIT_OK
    if not args.worker_token:
        print("steady launch slurm: --worker-token (or STEADY_WORKER_TOKEN) is required", file=sys.stderr)
        return EXIT_USAGE
    study = _study_to_launch(api, args.study)
    script = Path(args.output_dir).resolve() / f"steady-study-{args.study}.sbatch"
    try:
        job_id = slurm.submit(launch, worker_token=args.worker_token, script_path=script)
    except slurm.LaunchError as exc:
        print(f"steady launch slurm: {exc}", file=sys.stderr)
        return EXIT_FAIL
    _record(api, args.study, "slurm", job_id, args.tasks, {
        "script": str(script), "partition": args.partition or "", "time": args.time or "",
        "gpus_per_task": args.gpus_per_task, "output": str(Path(args.output_dir).resolve() / "steady-slurm-%A_%a.out"),
    })
    print(f"submitted Slurm job array {job_id} ({args.tasks} tasks) for study {study['id']} ({printable(study['name'])});"
          f" logs: {printable(Path(args.output_dir).resolve())}/steady-slurm-{job_id}_N.out", file=sys.stderr)
    print(job_id)
    return EXIT_OK


def cmd_k8s(args: argparse.Namespace) -> int:
    from steady.server.cli.client import Api
    from steady.server.engines import kubernetes as k8s

    api = Api(args.server, args.token)
    try:
        launch = k8s.K8sLaunch(
            study_id=args.study, server=args.agent_server or api.server, image=args.image,
            parallelism=args.parallelism, gpu=args.gpu, namespace=args.namespace,
            node_selector=k8s.parse_selector(args.node_selector), token_secret=args.token_secret,
            backoff_limit=args.backoff_limit, cpu=args.cpu, memory=args.memory,
            worker_args=tuple(args.worker_arg), name=args.job_name,
        )
    except k8s.ManifestError as exc:
        print(f"steady launch k8s: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.with_secret and not args.worker_token:
        print("steady launch k8s: --with-secret needs --worker-token (or STEADY_WORKER_TOKEN)", file=sys.stderr)
        return EXIT_USAGE
    if args.apply:
        study = _study_to_launch(api, args.study)
        uid = k8s.apply(launch, secret_token=args.worker_token if args.with_secret else None)
        _record(api, args.study, "kubernetes", launch.job_name, args.parallelism,
                {"namespace": launch.namespace, "uid": uid, "image": launch.image, "gpu": launch.gpu})
        print(f"created Job {launch.namespace}/{launch.job_name} ({args.parallelism} pods) for study "
              f"{study['id']} ({printable(study['name'])})", file=sys.stderr)
        print(launch.job_name)
        return EXIT_OK
    docs = ([k8s.token_secret(launch, args.worker_token)] if args.with_secret else []) + [k8s.agent_job(launch)]
    text = k8s.to_yaml(docs)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: kubectl apply -f {args.output}", file=sys.stderr)
    return EXIT_OK


def launch_lines(launches: list[dict[str, Any]]) -> list[str]:
    """``steady status``: one line per launch, newest first."""
    out = []
    for x in launches:
        d = x.get("detail") or {}
        where = f"  ns {printable(d['namespace'])}" if d.get("namespace") else ""  # recorded by a user: no escapes
        out.append(f"       {x['engine']} job {printable(x['job_id'])}  {x['tasks']} agent(s){where}  "
                   f"launched {printable(x['created_at'][:19])}Z")
    return out
