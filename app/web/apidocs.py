"""/docs (Swagger UI) and /redoc (ReDoc), served from the package: no CDN, no inline script.

FastAPI's own pages load both from jsDelivr and start them with an inline script, so offline
they are blank and under the Content-Security-Policy they would not run. These pages load the
assets ``scripts/fetch-assets`` puts in ``app/dashboard/static/apidocs/`` (npm packages pinned in
``package-lock.json``, shipped in the wheel) and start them from a file.
"""

from __future__ import annotations

from html import escape

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

STATIC = "/static/apidocs"

# ReDoc styles itself with styled-components (<style> elements it writes at run time) and
# renders in a blob: worker, so /redoc allows inline styles and blob: workers; scripts,
# connections and everything else stay 'self' only.
REDOC_CSP_EXTRA = {"style-src": "'self' 'unsafe-inline'", "worker-src": "'self' blob:"}


def _page(title: str, head: str, body: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
{head}
</head>
<body>
{body}
</body>
</html>
"""


def install(app: FastAPI) -> None:
    """Add /docs and /redoc to an app created with ``docs_url=None, redoc_url=None``."""
    openapi_url = app.openapi_url or "/openapi.json"
    title = app.title

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return HTMLResponse(_page(
            f"{title} — API",
            f'<link rel="stylesheet" href="{STATIC}/swagger-ui.css">',
            f'<div id="swagger-ui" data-openapi-url="{escape(openapi_url)}"></div>\n'
            f'<script src="{STATIC}/swagger-ui-bundle.js"></script>\n'
            f'<script src="{STATIC}/swagger-init.js"></script>'))

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return HTMLResponse(_page(
            f"{title} — API reference", "",
            f'<div id="redoc" data-openapi-url="{escape(openapi_url)}"></div>\n'
            f'<script src="{STATIC}/redoc.standalone.js"></script>\n'
            f'<script src="{STATIC}/redoc-init.js"></script>'))


# The description at the top of /docs and /redoc: the conventions every /api/v1 route follows.
CONVENTIONS = """
**Lists** answer one page: `{"items": [...], "total": n, "limit": l, "offset": o}`, with the query
parameters `limit` (1–500, default 100) and `offset` (default 0). The next page starts at
`offset + limit`; there is none once that reaches `total`.

**Errors** answer one shape, whatever the status:
`{"detail": [{"loc": ["body", "seeds", 0], "msg": "...", "type": "..."}]}`. `loc` names the input
at fault (`[]` when none); `type` is machine-readable: pydantic's error types for a 422 of request
validation (`missing`, `int_parsing`, ...), `value_error` for input a service refused, else
`unauthorized` (401), `forbidden` (403), `not_found` (404), `conflict` (409), `too_large` (413),
`too_many_requests` (429), `internal_error` (500), `unavailable` (503) or a specific code
(`lease_lost`, `already_finished`, `not_lease_holder`, `lease_cap`). 429 and 503 carry
`Retry-After`: a 503 means the database is busy or unavailable, so retrying is safe; a 500 is a
bug, logged with its traceback on the server. The MLflow-compatible routes under `/mlflow` keep
MLflow's shapes (`{"error_code", "message"}`).
"""
