"""A study's answers where users already look: TensorBoard event files and an MLflow summary run.

TensorBoard: each (metric, group) seed band as scalars (``band/<metric>/<group>/mean``, ``…/lower``,
``…/upper``, ``…/n``) with a custom-scalars *margin chart* whose title says what the band is and over how many
runs; the sources table as scalars (``sources/<metric>/<source>/sd`` and its interval, at step 0) with its own
margin chart; the verdicts and the outcome as text. Written with the ``tensorboard`` package's own protos and
event writer, so TensorBoard shows it unchanged.

MLflow: one summary run (tags ``steady.*``: the outcome, each verdict, each band's meaning and N, each source's
TOST verdict; metrics: the band per step, the per-source SDs) through MLflow's REST API 2.0, so any MLflow
tracking server (or Steady's own ``/mlflow`` endpoint) takes it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from steady.server.reports.models import Bands, Report


def _group_name(g: Any) -> str:
    return f"{g.determinism}-{g.stack}"


def band_meaning(b: Any) -> str:
    """What the band is, in words, with N (the dashboard's legend says the same)."""
    n = len(b.run_ids)
    return (f"mean and {b.coverage:.0%}/{b.confidence:.0%} normal tolerance interval (covers {b.coverage:.0%} "
            f"of runs with {b.confidence:.0%} confidence), N = {n} runs")


def _clean(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def write_tensorboard(logdir: str | Path, report: Report, bands: Sequence[Bands]) -> Path:
    """Write the study's event file under ``logdir``; returns its path."""
    try:
        from tensorboard.compat.proto import types_pb2
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import metadata as cs_metadata
        from tensorboard.plugins.text import metadata as text_metadata
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        raise SystemExit("--tensorboard needs the tensorboard package: pip install tensorboard") from None

    out = Path(logdir)
    out.mkdir(parents=True, exist_ok=True)
    now = time.time()
    # the event file as TensorBoard's own writer names and frames it (its EventFileWriter would import TensorFlow
    # when installed, seconds for nothing: RecordWriter is the same framing without it)
    path = out / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.steady-{report.study.id}"
    writer = RecordWriter(open(path, "wb"))  # noqa: SIM115 — closed below

    def add(event: Any) -> None:
        writer.write(event.SerializeToString())

    add(Event(wall_time=now, step=0, file_version="brain.Event:2"))

    def scalar(tag: str, value: float | None, step: int) -> None:
        if value is not None:
            add(Event(wall_time=now, step=step, summary=Summary(value=[
                Summary.Value(tag=tag, simple_value=value)])))

    def text(tag: str, value: str) -> None:
        tensor = TensorProto(dtype=types_pb2.DT_STRING, string_val=[value.encode()],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        add(Event(wall_time=now, step=0, summary=Summary(value=[Summary.Value(
            tag=tag, metadata=text_metadata.create_summary_metadata(display_name=tag, description=""),
            tensor=tensor)])))

    categories = []
    for b in bands:
        charts = []
        for g in b.groups:
            prefix = f"band/{b.metric}/{_group_name(g.group)}"
            for i, step in enumerate(g.steps):
                scalar(f"{prefix}/mean", _clean(g.mean[i]), step)
                scalar(f"{prefix}/lower", _clean(g.ti_low[i]), step)
                scalar(f"{prefix}/upper", _clean(g.ti_high[i]), step)
                scalar(f"{prefix}/n", float(g.n[i]), step)
            charts.append(layout_pb2.Chart(
                title=f"{b.metric} {_group_name(g.group)}: {band_meaning(g)}",
                margin=layout_pb2.MarginChartContent(series=[layout_pb2.MarginChartContent.Series(
                    value=f"{prefix}/mean", lower=f"{prefix}/lower", upper=f"{prefix}/upper")])))
        if charts:
            categories.append(layout_pb2.Category(title=f"Steady band: {b.metric}", chart=charts))
    for t in report.sources or []:
        series = []
        rows = [*t.rows, *([t.all_sources] if t.all_sources else [])]
        for r in rows:
            if r.status != "measured":
                text(f"sources/{t.metric}/{r.source}", f"{r.label}: {r.status.replace('_', ' ')} ({r.note})")
                continue
            prefix = f"sources/{t.metric}/{r.source}"
            scalar(f"{prefix}/sd", _clean(r.sd), 0)
            scalar(f"{prefix}/sd_lower", _clean(r.sd_lower), 0)
            scalar(f"{prefix}/sd_upper", _clean(r.sd_upper), 0)
            series.append(layout_pb2.MarginChartContent.Series(value=f"{prefix}/sd", lower=f"{prefix}/sd_lower",
                                                               upper=f"{prefix}/sd_upper"))
            verdict = r.vs_all.verdict if r.vs_all else "reference"
            text(f"sources/{t.metric}/{r.source}", f"{r.label}: SD {r.sd:.4g} [{r.sd_lower:.4g}, {r.sd_upper:.4g}] "
                 f"(robust 90%), n = {r.n}; against all sources: {verdict}")
        if series:
            categories.append(layout_pb2.Category(title=f"Steady sources: {t.metric}", chart=[layout_pb2.Chart(
                title=f"SD of final {t.metric} per source (robust 90% interval), margin ×{t.margin:g} of all sources",
                margin=layout_pb2.MarginChartContent(series=series))]))
    text("steady/outcome", f"{report.outcome.status}: {report.outcome.reason}")
    for v in report.verdicts:
        text(f"steady/verdict/{v.level}/{v.metric}", f"{v.verdict}: {v.reason}")
    layout = layout_pb2.Layout(category=categories)
    tensor = TensorProto(dtype=types_pb2.DT_STRING, string_val=[layout.SerializeToString()],
                         tensor_shape=TensorShapeProto())
    add(Event(wall_time=now, step=0, summary=Summary(value=[Summary.Value(
        tag=cs_metadata.CONFIG_SUMMARY_TAG, metadata=cs_metadata.create_summary_metadata(), tensor=tensor)])))
    writer.close()
    return path


def _summary_items(report: Report, bands: Sequence[Bands]) -> tuple[list[dict], list[dict]]:
    tags = [{"key": "steady.study_id", "value": str(report.study.id)},
            {"key": "steady.outcome", "value": f"{report.outcome.status}: {report.outcome.reason}"[:8000]}]
    metrics: list[dict] = []
    ts = int(time.time() * 1000)
    for v in report.verdicts:
        group: dict[str, Any] = v.group if isinstance(v.group, dict) else v.group.model_dump(mode="json")
        where = "-".join(str(x) for x in group.values() if isinstance(x, str))
        tags.append({"key": f"steady.verdict.{v.level}.{v.metric}.{where}"[:250], "value": f"{v.verdict}: {v.reason}"[:8000]})
    for b in bands:
        for g in b.groups:
            name = f"band/{b.metric}/{_group_name(g.group)}"
            tags.append({"key": f"steady.{name}", "value": band_meaning(g)})
            for i, step in enumerate(g.steps):
                for part, values in (("mean", g.mean), ("lower", g.ti_low), ("upper", g.ti_high)):
                    value = _clean(values[i])
                    if value is not None:
                        metrics.append({"key": f"{name}/{part}", "value": value, "timestamp": ts, "step": int(step)})
    for t in report.sources or []:
        for r in [*t.rows, *([t.all_sources] if t.all_sources else [])]:
            prefix = f"sources/{t.metric}/{r.source}"
            if r.status != "measured":
                tags.append({"key": f"steady.{prefix}", "value": f"{r.status}: {r.note}"})
                continue
            for part, value in (("sd", r.sd), ("sd_lower", r.sd_lower), ("sd_upper", r.sd_upper)):
                if (clean := _clean(value)) is not None:
                    metrics.append({"key": f"{prefix}/{part}", "value": clean, "timestamp": ts, "step": 0})
            verdict = r.vs_all.verdict if r.vs_all else "reference (all sources)"
            tags.append({"key": f"steady.{prefix}", "value": f"{verdict}; n = {r.n}"})
    return metrics, tags


def write_mlflow(uri: str, report: Report, bands: Sequence[Bands], *, experiment: str,
                 token: str | None = None) -> str:
    """Log a summary run into the MLflow tracking server at ``uri``; returns the run id."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = uri.rstrip("/") + "/api/2.0/mlflow"
    with httpx.Client(headers=headers, timeout=60) as c:
        def call(method: str, path: str, **kw: Any) -> dict:
            r = c.request(method, f"{base}/{path}", **kw)
            if r.status_code >= 400:
                raise SystemExit(f"MLflow {path}: HTTP {r.status_code}: {r.text[:500]}")
            return r.json()

        got = c.get(f"{base}/experiments/get-by-name", params={"experiment_name": experiment})
        if got.status_code == 200:
            exp_id = got.json()["experiment"]["experiment_id"]
        elif got.status_code == 404:
            exp_id = call("POST", "experiments/create", json={"name": experiment})["experiment_id"]
        else:
            raise SystemExit(f"MLflow experiments/get-by-name: HTTP {got.status_code}: {got.text[:500]}")
        run = call("POST", "runs/create", json={
            "experiment_id": exp_id, "run_name": f"steady-study-{report.study.id}-summary",
            "start_time": int(time.time() * 1000)})["run"]["info"]
        run_id = run["run_id"]
        metrics, tags = _summary_items(report, bands)
        for i in range(0, len(tags), 100):
            call("POST", "runs/log-batch", json={"run_id": run_id, "tags": tags[i:i + 100]})
        for i in range(0, len(metrics), 1000):
            call("POST", "runs/log-batch", json={"run_id": run_id, "metrics": metrics[i:i + 1000]})
        call("POST", "runs/update", json={"run_id": run_id, "status": "FINISHED", "end_time": int(time.time() * 1000)})
    return run_id
