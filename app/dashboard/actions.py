"""The dashboard's one write: the Localize button asks a worker to localize where two repeats part.

A form post (no JavaScript needed) from a page of this server: the browser's session cookie names the
caller (bearer tokens are not a browser's), the form carries the session's form key (which a page of
another site cannot know) and must come from this origin; then the same service as
``POST /api/v1/studies/{id}/localization-jobs`` decides (owner or admin, two repeats, one at a time). The
answer is a redirect back to the page, with the reason when it was refused.
"""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Request, status
from fastapi.responses import PlainTextResponse, RedirectResponse, Response

from steady.server.dashboard.access import form_key, safe_next, same_origin
from steady.server.kit.auth import GRANTS, Role, session_token
from steady.server.kit.deps import SESSION_COOKIE, Principal
from steady.server.kit.errors import SteadyError
from steady.server.lifecycle import localizing

router = APIRouter(include_in_schema=False)


def _back(target: str, error: str | None = None) -> RedirectResponse:
    where = safe_next(target)
    if error is not None:
        where += ("&" if "?" in where else "?") + "localize_error=" + quote(error[:300], safe="")
    return RedirectResponse(where + "#localization", status_code=status.HTTP_303_SEE_OTHER)


@router.post("/studies/{study_id}/localize", response_model=None)
def localize(request: Request, study_id: int, runs: Annotated[list[int], Form()],
             key: Annotated[str, Form(alias="form_key", max_length=100)] = "",
             next: Annotated[str, Form(max_length=2000)] = "") -> Response:
    if not same_origin(request):
        return PlainTextResponse("This form was posted from another site.", status_code=403)
    sid = request.cookies.get(SESSION_COOKIE)
    if not sid or not hmac.compare_digest(key, form_key(sid)):
        return PlainTextResponse("Sign in to the dashboard first (this form needs your session).", status_code=403)
    database = request.app.state.database
    with database.read() as session:
        token = session_token(session, sid)
        caller = Principal(token_id=token.id, name=token.name, role=Role(token.role)) if token else None
    if caller is None or caller.role not in GRANTS[Role.user]:
        return RedirectResponse(f"/login?next={quote(next or f'/studies/{study_id}', safe='')}",
                                status_code=status.HTTP_303_SEE_OTHER)
    target = next or f"/studies/{study_id}"
    try:
        with database.write() as session:
            localizing.request(session, study_id, localizing.LocalizationJobRequest(runs=runs), caller)
    except SteadyError as exc:
        return _back(target, str(exc))
    except ValueError as exc:  # the pair's shape (not two runs)
        return _back(target, f"two runs, the repeats to compare: {exc}")
    return _back(target)
