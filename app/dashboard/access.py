"""Who is looking at the dashboard, and logging in and out.

Access: a user or admin token, sent as ``Authorization: Bearer``, or a server-side session
whose random id is the HTTP-only ``steady_session`` cookie that ``POST /login`` sets (the
token itself never reaches the browser's storage; logout revokes the session). Unauthenticated page requests are
redirected to ``/login``; the JSON feeds answer 401. With ``STEADY_PUBLIC_DASHBOARD=true``
every page is readable without a token. The dashboard's one write, the Localize button
(``dashboard.actions``), needs a session, its form key and a same-origin post.
"""

from __future__ import annotations

import hashlib
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from steady.server.kit.auth import GRANTS, Role, authenticate, create_session, revoke_session
from steady.server.dashboard.views import Viewer, render
from steady.server.kit.deps import SESSION_COOKIE, OptionalCaller, Principal

router = APIRouter(include_in_schema=False)


def form_key(session_id: str) -> str:
    """The key a session's forms carry: derived from the session id, which a page of another site cannot read."""
    return hashlib.sha256(f"steady-dashboard-form:{session_id}".encode()).hexdigest()


def _viewer(request: Request, principal: Principal | None) -> Viewer | None:
    """A user or admin token (or their session) sees the dashboard; anyone does when it is public."""
    public = request.app.state.settings.public_dashboard
    if principal is not None and principal.role in GRANTS[Role.user]:
        sid = request.cookies.get(SESSION_COOKIE) if "authorization" not in request.headers else None
        return Viewer(name=principal.name, public=public, token_id=principal.token_id,
                      admin=principal.role is Role.admin, form_key=form_key(sid) if sid else None)
    return Viewer(name=None, public=True) if public else None


async def page_viewer(request: Request, principal: OptionalCaller) -> Viewer:
    viewer = _viewer(request, principal)
    if viewer is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(status.HTTP_303_SEE_OTHER, "login required",
                            headers={"Location": f"/login?next={quote(target, safe='')}"})
    return viewer


async def data_viewer(request: Request, principal: OptionalCaller) -> Viewer:
    viewer = _viewer(request, principal)
    if viewer is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "login required")
    return viewer


PageViewer = Annotated[Viewer, Depends(page_viewer)]
DataViewer = Annotated[Viewer, Depends(data_viewer)]


def safe_next(target: str | None) -> str:
    """Only local paths: never redirect a fresh login to another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/studies"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/studies"
    return target


def same_origin(request: Request) -> bool:
    """A form post from another site carries its own Origin; refuse it (login CSRF).

    The Origin must name this server as the browser sees it: the scheme (https behind a trusted
    proxy's X-Forwarded-Proto) and the Host header with its port (a proxy must pass the Host it
    received, port included: nginx's ``$http_host``, not ``$host``)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    parts = urlsplit(origin)
    return _netloc(parts.scheme, parts.netloc) == _netloc(request.url.scheme, request.headers.get("host", ""))


def _netloc(scheme: str, netloc: str) -> str:
    default = {"http": ":80", "https": ":443"}.get(scheme.lower(), "")
    netloc = netloc.lower()
    return f"{scheme.lower()}://{netloc[: -len(default)] if default and netloc.endswith(default) else netloc}"


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str | None = None) -> HTMLResponse:
    return render(request, "login.html", None, next=safe_next(next), error=None)


@router.post("/login", response_model=None)
def login(request: Request, token: Annotated[str, Form(max_length=500)] = "",
          next: Annotated[str, Form(max_length=2000)] = "/studies") -> Response:
    if not same_origin(request):
        return render(request, "login.html", None, status_code=403, next=safe_next(next),
                       error="This form was posted from another site.")
    token = token.strip()
    with request.app.state.database.read() as session:
        row = authenticate(session, token) if token else None
        role = Role(row.role) if row is not None else None
        token_id = row.id if row is not None else None
    if row is None or role is None or token_id is None:
        return render(request, "login.html", None, status_code=401, next=safe_next(next),
                       error="That token is not valid (or was revoked).")
    if role not in GRANTS[Role.user]:
        return render(request, "login.html", None, status_code=403, next=safe_next(next),
                       error=f"A {role.value} token cannot open the dashboard; use a user or admin token.")
    settings = request.app.state.settings
    with request.app.state.database.write() as session:
        sid = create_session(session, token_id, settings.session_ttl_seconds)
    response = RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    # The cookie holds the session id only, never the token. Secure when the browser came over
    # https (directly, or through a trusted proxy: STEADY_FORWARDED_ALLOW_IPS).
    response.set_cookie(
        SESSION_COOKIE, sid, max_age=int(settings.session_ttl_seconds), httponly=True, samesite="lax",
        secure=request.url.scheme == "https", path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    if not same_origin(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "cross-site logout refused")
    sid = request.cookies.get(SESSION_COOKIE)
    if sid:
        with request.app.state.database.write() as session:
            revoke_session(session, sid)
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response
