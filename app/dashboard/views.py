"""The dashboard's templates, the filters they use, and rendering a page."""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from steady.server.dashboard import service
from steady.server.kit.terminal import printable_output
from steady.server.models import Run, utcnow
from steady.server.reports.parts import PairGroup, StackGroup

@dataclass(frozen=True)
class Viewer:
    name: str | None  # None: an anonymous reader of a public dashboard
    public: bool
    token_id: int | None = None
    admin: bool = False
    # A dashboard session's key for its forms (derived from the session id, which only the browser holds):
    # a form posted without it, from another site, changes nothing. None: no session (no forms shown).
    form_key: str | None = None

    def may_change(self, owner_token_id: int | None) -> bool:
        """What a form may change for this viewer: its token's objects (all of them for an admin)."""
        if self.form_key is None or self.token_id is None:
            return False
        return self.admin or (owner_token_id is not None and owner_token_id == self.token_id)


HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))


def db_key(request: Request) -> str:
    """The key of this database in the dashboard's caches."""
    return request.app.state.settings.resolved_database_url


def render(request: Request, template: str, viewer: Viewer | None, status_code: int = 200, **context) -> HTMLResponse:
    return templates.TemplateResponse(
        request, template, {"viewer": viewer, "now": utcnow(), **context}, status_code=status_code
    )


def not_found(request: Request, viewer: Viewer, what: str) -> HTMLResponse:
    return render(request, "not_found.html", viewer, status_code=404, what=what)


# --- filters used by the templates ------------------------------------------------------------


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "—"
    now = now or utcnow()
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    s = (now - value).total_seconds()
    if s < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{int(s // size)} {unit} ago"
    return f"{int(s)} s ago"


def _duration(run: Run) -> str:
    if run.started_at is None:
        return "—"
    end = run.finished_at or utcnow()
    start = run.started_at if run.started_at.tzinfo else run.started_at.replace(tzinfo=UTC)
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    s = (end - start).total_seconds()
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _short(digest: object, n: int = 10) -> str:
    if digest is None or digest == "" or digest == []:
        return "—"
    if isinstance(digest, list):
        return f"{_short(digest[0], n)} (+{len(digest) - 1})" if len(digest) > 1 else _short(digest[0], n)
    text = str(digest)
    return text if len(text) <= n else text[:n] + "…"


def _num(value: object, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    return str(value)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pct(value: object) -> str:
    return f"{value * 100:.0f} %" if isinstance(value, (int, float)) and _finite(value) else "—"


def _group(group: dict | StackGroup | PairGroup) -> str:
    if isinstance(group, (StackGroup, PairGroup)):
        group = group.as_dict()
    if "candidate_stack" in group:
        det = f"{group['determinism']}: " if group.get("determinism") else ""  # a sources decision has none
        return f"{det}{group.get('candidate_stack')} vs {group.get('reference_stack')}"
    return f"{group.get('determinism')} · {group.get('stack')}"


_MD_INLINE = re.compile(r"`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?<![*\w])\*([^*\n]+)\*(?![*\w])")


def _markdown_inline(text: object) -> Markup:
    """The inline Markdown people write in descriptions (`code`, **bold**, *em*), escaped
    first so nothing else in the text becomes markup; blank lines separate paragraphs."""
    def one(m: re.Match) -> str:
        code, bold, em = m.groups()
        if code is not None:
            return f"<code>{code}</code>"
        return f"<strong>{bold}</strong>" if bold is not None else f"<em>{em}</em>"

    paragraphs = re.split(r"\n\s*\n", str(text or "").strip())
    return Markup("".join(f"<p>{_MD_INLINE.sub(one, str(escape(p)))}</p>" for p in paragraphs if p))


def _first_line(text: object) -> str:
    """The first non-blank line of a run's error (the crash line the worker put first)."""
    return next((ln.strip() for ln in printable_output(text or "").splitlines() if ln.strip()), "")[:300]


def _when(value: datetime) -> str:
    """A timestamp for people: UTC, to the second (no microseconds, no ISO 'T')."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["when"] = _when
templates.env.tests["finite"] = _finite
templates.env.tests["loss_like"] = lambda name: bool(re.search(r"loss|mse|mae|rmse|error|perplexity|nll", str(name), re.IGNORECASE))
templates.env.filters.update(ago=_ago, duration=_duration, short=_short, num=_num, pct=_pct, group=_group,
                             tone=service.tone, markdown_inline=_markdown_inline, output=printable_output,
                             first_line=_first_line, shell=shlex.join)
