"""HTTP client used by the CLI's user commands (submit, status, report, alerts) and the demo."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"


class ApiError(Exception):
    """An error answer; ``detail`` is its message (the field it names first, when it names one)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


def describe_error(body: Any) -> str | None:
    """The message of an error body in the API's shape ``{"detail": [{"loc", "msg", "type"}]}``
    (or MLflow's ``{"message"}``); None when the body has neither."""
    if not isinstance(body, dict):
        return None
    detail = body.get("detail")
    if isinstance(detail, list):
        return "; ".join(_located(e) for e in detail if isinstance(e, dict)) or None
    if isinstance(detail, str):  # a server before the one error shape
        return detail
    message = body.get("message")
    return message if isinstance(message, str) else None


def _located(error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error.get("loc") or ())
    return f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", ""))


def token_file(data_dir: str | os.PathLike | None = None) -> Path:
    return Path(data_dir or os.environ.get("STEADY_DATA_DIR", ".steady")) / "token"


def resolve_with_source(server: str | None, token: str | None) -> tuple[str, str | None, str]:
    """Server, token and where the token came from.

    Server: ``--server``, ``STEADY_SERVER``, the default server of the ``steady login`` file, then the default.
    Token: ``--token``, ``STEADY_TOKEN``, the token ``steady login`` saved for this server (one per server),
    then ``<STEADY_DATA_DIR or .steady>/token`` (written by ``steady token create --save``).
    """
    from steady.server.cli.support import config_path, read_logins

    default, saved = read_logins()
    server = (server or os.environ.get("STEADY_SERVER") or default or DEFAULT_SERVER).rstrip("/")
    if token:
        return server, token, "--token"
    if os.environ.get("STEADY_TOKEN"):
        return server, os.environ["STEADY_TOKEN"], "STEADY_TOKEN"
    if saved.get(server):
        return server, saved[server], str(config_path())
    path = token_file()
    if path.is_file():
        return server, path.read_text().strip(), str(path)
    return server, None, ""


def resolve(server: str | None, token: str | None) -> tuple[str, str | None]:
    server, token, _ = resolve_with_source(server, token)
    return server, token


class Api:
    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.server, self.token, self.token_source = resolve_with_source(server, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    # A read refused with 429 (the server admits a few heavy reads per token at once: a report, bands, a
    # compare) is asked again after the Retry-After it names, a few times, then the 429 is the answer.
    READ_RETRIES = 4
    MAX_RETRY_AFTER_S = 30.0

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        for attempt in range(self.READ_RETRIES + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                raise ApiError(0, f"cannot reach {self.server}: {exc}") from None
            wait = response.headers.get("Retry-After", "")
            if (response.status_code != 429 or method != "GET" or not wait.isdigit()
                    or attempt == self.READ_RETRIES):
                break
            time.sleep(min(float(wait), self.MAX_RETRY_AFTER_S))
        if response.status_code >= 400:
            try:
                detail = describe_error(response.json()) or response.text
            except ValueError:
                detail = response.text
            if response.status_code == 401:
                detail = self._refused()
            raise ApiError(response.status_code, detail)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def get_bytes(self, path: str) -> bytes:
        """The body of a GET as bytes (a code archive), with the same errors as :meth:`request`."""
        try:
            response = self._http.get(path)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach {self.server}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, self._refused() if response.status_code == 401 else response.text)
        return response.content

    def _refused(self) -> str:
        from steady.server.cli.support import LOGIN_HINT

        if not self.token:
            return f"{self.server} needs a token and none was given (401): {LOGIN_HINT}"
        return f"the server refused the token from {self.token_source} (401): {LOGIN_HINT}"

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)


def progress_bar(p: dict[str, int], width: int = 30) -> str:
    total = max(p.get("total", 0), 1)
    done = p.get("completed", 0) + p.get("failed", 0) + p.get("cancelled", 0)
    filled = int(width * done / total)
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{p.get('total', 0)} runs"
        f"  running {p.get('running', 0)}  failed {p.get('failed', 0)}"
    )


def wait_for(api, study_id: int, *, interval: float = 1.0, stream=sys.stderr) -> dict[str, Any]:
    """Poll a study until it ends, drawing a progress bar; returns the final study."""
    tty = stream.isatty()
    last = ""
    while True:
        study = api.get(f"/api/v1/studies/{study_id}")
        line = f"study {study_id} {study['status']:<9} {progress_bar(study['progress'])}"
        if tty:
            stream.write("\r" + line.ljust(len(last)))
        elif line != last:
            stream.write(line + "\n")
        stream.flush()
        last = line
        if study["status"] in {"completed", "failed", "cancelled"}:
            if tty:
                stream.write("\n")
            return study
        time.sleep(interval)
