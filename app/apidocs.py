"""/docs (Swagger UI) and /redoc (ReDoc), served from the package: no CDN, no inline script.

FastAPI's own pages load both from jsDelivr and start them with an inline script, so offline
they are blank and under the Content-Security-Policy they would not run. These pages load the
vendored assets in ``app/dashboard/static/apidocs/`` and start them from a file.
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
