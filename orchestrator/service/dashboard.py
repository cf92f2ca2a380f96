"""The live page of a run (``GET /dashboard``), served by the REST app itself.

One HTML page and its static files, read from this package (``static/dashboard/``): no build
step, no server beyond the REST service, nothing fetched from the internet. The page's script
polls ``GET v1/stats`` and ``GET v1/policy`` (URLs relative to the page, so it works under any
Serve route prefix) every ``?refresh=`` seconds (default 2, at least 0.5), keeps the run's
history since the page was opened in the browser's memory, draws it with uPlot, and marks each
change of the resampling policy's revision on every chart's time axis. A failed poll (the
orchestrator actor restarting: 503) is shown and the polling goes on.

A policy field is changed from the page with ``PATCH v1/policy`` and ``If-Match`` (the revision
the page shows, so a concurrent change gets 409 rather than being overwritten). The bearer token,
where the service has one, is typed into a password field and sent with that request only: the
page never writes it to cookies, local or session storage, or the URL.

Charting library: uPlot 1.6.32 (MIT, ``uPlot.LICENSE``), vendored as ``uPlot.iife.min.js`` (51 kB)
and ``uPlot.min.css``: one dependency-free file, canvas time series made for streaming data.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, Response

STATIC = Path(__file__).resolve().parent / "static" / "dashboard"
"""The page's files (``index.html``, its script and style, the vendored uPlot)."""

ASSETS: dict[str, str] = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
"""The files served under ``/dashboard/<name>`` and their content types; any other name is 404."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Scripts and requests from this origin only (no inline script: the page has none); inline styles
are allowed because uPlot sizes its elements with them."""


def dashboard_router() -> APIRouter:
    """The routes ``GET /dashboard`` (the page) and ``GET /dashboard/<asset>`` (its files).

    The files are read once, here (a missing one raises ``FileNotFoundError`` at app build).
    """
    page = (STATIC / "index.html").read_bytes()
    files = {name: (STATIC / name).read_bytes() for name in ASSETS}
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"}
    router = APIRouter()

    @router.get("/dashboard", response_class=HTMLResponse, tags=["service"])
    async def dashboard() -> Response:
        """The live page of the run: counters and charts from ``/v1/stats``, the policy, a form to change
        one policy field (``?refresh=<seconds>``, default 2)."""
        return Response(page, media_type="text/html; charset=utf-8", headers={**headers, "Cache-Control": "no-cache"})

    @router.get("/dashboard/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in files:
            raise HTTPException(404, f"dashboard file {name!r} not found (files: {', '.join(sorted(files))})")
        return Response(files[name], media_type=ASSETS[name], headers={**headers, "Cache-Control": "max-age=300"})

    return router
