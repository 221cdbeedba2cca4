"""The web dashboard: a few static pages, and the metrics history they draw.

The pages (``/dashboard/``: the jobs table; ``/dashboard/job.html?job=NAME``: one job's curves,
replicas, log tail and a cancel button) are public files that hold no data: their script asks
for a token once, keeps it in the tab's ``sessionStorage`` and calls the authenticated REST API
with it (``GET /v1/jobs``, ``GET /v1/jobs/{name}``, ``.../logs``, ``.../metrics``,
``DELETE /v1/jobs/{name}``). No third-party asset is loaded (the charts are SVG drawn by our own
script), so the pages are served with a Content-Security-Policy that allows only this origin's
script and style, no inline code, and no framing.

``GET /v1/jobs/{name}/metrics`` returns :class:`~elasticdl.common.job_status.MetricsHistory`:
the training loss and the evaluation metrics over model versions, read from the job's status.
"""

from __future__ import annotations

import importlib.resources
from typing import Callable

from elasticdl.common.job_status import JobStatus, MetricsHistory
from elasticdl.server.deps import current_user
from elasticdl.server.errors import NotFound
from fastapi import APIRouter, Depends
from fastapi.responses import RedirectResponse, Response

# (user, job name) -> the job's status; raises NotFound for a job the user cannot see.
StatusOf = Callable[[str, str], JobStatus]

PREFIX = "/dashboard"
STATIC_PACKAGE = "elasticdl.server"
STATIC_DIR = "dashboard_static"
# The only files served: a fixed list, so no request path reaches the file system.
STATIC_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "job.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # The files change with the server's version only; revalidating them costs little.
    "Cache-Control": "no-cache",
}


def load_static() -> dict[str, bytes]:
    root = importlib.resources.files(STATIC_PACKAGE) / STATIC_DIR
    return {name: (root / name).read_bytes() for name in STATIC_TYPES}


def dashboard_router(status_of: StatusOf) -> APIRouter:
    files = load_static()
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    @router.get(PREFIX, include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    @router.get(f"{PREFIX}/", include_in_schema=False)
    @router.get(PREFIX + "/{file}", include_in_schema=False)
    def static(file: str = "index.html") -> Response:
        if file not in files:
            raise NotFound(f"no dashboard file {file!r}; open {PREFIX}/")
        return Response(files[file], media_type=STATIC_TYPES[file], headers=SECURITY_HEADERS)

    @router.get("/v1/jobs/{name}/metrics", tags=["jobs"])
    def metrics(name: str, user: str = Depends(current_user)) -> dict:
        """Training loss and evaluation metrics over model versions, oldest first."""
        return MetricsHistory.of(status_of(user, name)).to_dict()

    return router
