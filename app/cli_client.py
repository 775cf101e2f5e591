"""HTTP client used by the CLI's user commands (submit, status, report, alerts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"


class ApiError(Exception):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


def token_file(data_dir: str | os.PathLike | None = None) -> Path:
    return Path(data_dir or os.environ.get("STEADY_DATA_DIR", ".steady")) / "token"


def resolve(server: str | None, token: str | None) -> tuple[str, str | None]:
    server = server or os.environ.get("STEADY_SERVER") or DEFAULT_SERVER
    token = token or os.environ.get("STEADY_TOKEN")
    if not token and token_file().is_file():
        token = token_file().read_text().strip()
    return server.rstrip("/"), token


class Api:
    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.server, self.token = resolve(server, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach {self.server}: {exc}") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)
