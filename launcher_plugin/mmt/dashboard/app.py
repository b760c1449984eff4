"""The dashboard's Starlette app: the page, its static files, and the JSON endpoints it polls.

Jobs are named by opaque ids from the app's own discovery (:class:`mmt.dashboard.data.Catalog`), logs by a
name from the job's own listing: no request can point the app at a path of its choosing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmt.dashboard import data

STATIC_DIR = Path(__file__).resolve().parent / "static"
# a page on another site that rebinds its name to 127.0.0.1 must not be able to read the API
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response (plain ASGI: no per-request task overhead)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _query_number(request: Request, name: str, kind: type) -> Any:
    """The query parameter as ``kind`` (None when absent); ValueError when malformed or negative."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    value = kind(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(name)
    return value


def create_app(
    roots: list[Path],
    extra_job_dirs: Callable[[], list[Path]] | None = None,
    *,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
) -> Starlette:
    """The dashboard over the job dirs under ``roots`` and those ``extra_job_dirs()`` returns (the
    registry's). ``allowed_hosts``: the Host headers served (loopback names; ``["*"]`` to serve remotely)."""
    catalog = data.Catalog(roots, extra_job_dirs)

    def job_root(request: Request) -> Path | None:
        return catalog.lookup(request.path_params["job_id"])

    def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html")

    def jobs(request: Request) -> Response:
        return JSONResponse({"sweeps": data.sweeps(catalog.jobs())})

    def job(request: Request) -> Response:
        root = job_root(request)
        if root is None:
            return _error(404, "unknown job")
        return JSONResponse(data.job_detail(request.path_params["job_id"], root))

    def metrics(request: Request) -> Response:
        root = job_root(request)
        if root is None:
            return _error(404, "unknown job")
        try:
            since = _query_number(request, "since", float)
        except ValueError:
            return _error(400, "since: expected a unix time")
        return JSONResponse({"nodes": data.node_metrics(root, since)})

    def curves(request: Request) -> Response:
        root = job_root(request)
        if root is None:
            return _error(404, "unknown job")
        return JSONResponse(data.training_curves(root))

    def log(request: Request) -> Response:
        root = job_root(request)
        if root is None:
            return _error(404, "unknown job")
        name = request.query_params.get("name", "")
        if not data.is_log_name(name):
            return _error(400, "name: expected one of the job's logs, e.g. node0.rank0.log")
        try:
            offset = _query_number(request, "offset", int)
        except ValueError:
            return _error(400, "offset: expected a byte offset >= 0")
        path = data.log_path(root, name)
        # a finished job's last line may lack its newline: send it; a running job's may still be written
        running = data.job_state(root)[0] == "RUNNING"
        chunk = data.read_log(path, offset, whole_lines=running) if path else None
        if chunk is None:
            return _error(404, "no such log")
        return JSONResponse({"name": name, **chunk})

    def sweep(request: Request) -> Response:
        sweep_id = request.path_params["sweep_id"]
        for group in data.sweeps(catalog.jobs()):
            if group["id"] == sweep_id:
                return JSONResponse({**group, **data.swept_parameters(group["jobs"])})
        return _error(404, "unknown sweep")

    routes = [
        Route("/", index),
        Route("/api/jobs", jobs),
        Route("/api/jobs/{job_id}", job),
        Route("/api/jobs/{job_id}/metrics", metrics),
        Route("/api/jobs/{job_id}/curves", curves),
        Route("/api/jobs/{job_id}/log", log),
        Route("/api/sweeps/{sweep_id}", sweep),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware)
