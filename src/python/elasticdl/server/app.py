"""The job server's FastAPI application: thin routes over the plain classes of this package
(``TokenStore``, ``PackageStore``, ``DataStore``, ``JobService``).

Every route requires a bearer token, the OpenAPI schema included (``GET /v1/openapi.json``),
checked before any byte of a body is read (``request_gate``; ``deps.current_user`` names the
user); only the dashboard's static pages are public. FastAPI's unauthenticated /docs, /redoc
and /openapi.json are off.
Errors are ``{"detail": "<one line>"}`` with a 4xx status.
"""

from __future__ import annotations

import dataclasses
import re

from elasticdl.common.job_spec import MAX_JOB_NAME_LENGTH
from elasticdl.jobs.job_request import JobRequest
from elasticdl.k8s.pod_logs import PodLogs
from elasticdl.server.auth import TokenStore
from elasticdl.server.config import ServerConfig
from elasticdl.server.dashboard import PREFIX as DASHBOARD_PREFIX
from elasticdl.server.dashboard import dashboard_router
from elasticdl.server.data_store import CHECKSUM_HEADER, DataStore
from elasticdl.server.deps import current_user
from elasticdl.server.errors import BadRequest, ServerError
from elasticdl.server.jobs import JobService, KubernetesTarget, job_dict
from elasticdl.server.packages import PackageStore
from elasticdl.server.request_gate import RequestGate, public_path
from elasticdl.server.uploads import clear_tmp, declared_length
from elasticdl.version import __version__
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

API_VERSION = "v1"
JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def checked_job_name(name: str) -> str:
    """A job name of a route, as a submitted job's is checked: a name that cannot be a job's is
    400 before it reaches the file system (where an over-long one is an OSError)."""
    if len(name) > MAX_JOB_NAME_LENGTH or not JOB_NAME.fullmatch(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise BadRequest(
            f"{shown!r} is not a job name: lowercase letters, digits and '-', at most "
            f"{MAX_JOB_NAME_LENGTH} characters"
        )
    return name


@dataclasses.dataclass
class Services:
    config: ServerConfig
    tokens: TokenStore
    packages: PackageStore
    data: DataStore
    jobs: JobService


def build_services(config: ServerConfig, pod_logs: PodLogs | None = None) -> Services:
    config.make_dirs()
    clear_tmp(config.tmp_dir)  # uploads a killed server left half-done
    packages = PackageStore(
        config.packages_dir,
        config.tmp_dir,
        config.max_package_bytes,
        config.max_extracted_bytes,
        config.max_package_members,
        config.package_users_dir,
    )
    data = DataStore(config.data_dir, config.sums_dir, config.tmp_dir, config.max_data_bytes)
    target = KubernetesTarget(
        config.namespace, config.kube_context, config.data_volume, config.image_pull_secrets
    )
    jobs = JobService(
        config.jobs_dir,
        packages,
        data,
        platform=config.platform,
        kubernetes=target,
        builds=config.builds,
        state_root=config.root,
        pod_logs=pod_logs,
    )
    jobs.start_builds()
    return Services(config, TokenStore(config.tokens_file), packages, data, jobs)


def _one_line_validation_error(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    if not errors:
        return 422, "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return 400, f"malformed JSON body: {ctx.get('error', 'cannot parse')}"
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    where = ".".join(loc) or "body"
    if first.get("type") in ("extra_forbidden", "unexpected_keyword_argument"):
        return 422, f"unknown field {where!r} in the request; remove it"
    if first.get("type") == "missing":
        return 422, f"field {where!r} is required"
    return 422, f"field {where!r}: {first.get('msg', 'invalid')}"


class BodyCap:
    """ASGI middleware: ``POST /v1/jobs`` bodies over ``limit`` bytes get 413 before anything
    parses them (a job request is a spec of a few KiB; FastAPI would read any size into
    memory). A body without Content-Length is read up to the limit and replayed."""

    def __init__(self, app, path: str, limit: int) -> None:
        self.app = app
        self.path = path
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit():
            if int(length) > self.limit:
                return await self._too_large(scope, receive, send)
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._too_large(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send) -> None:
        reason = (
            f"the request body is over the server's limit of {self.limit >> 10} KiB; "
            "send a smaller spec"
        )
        await JSONResponse({"detail": reason}, status_code=413)(scope, receive, send)


def create_app(config: ServerConfig, services: Services | None = None) -> FastAPI:
    services = services or build_services(config)
    app = FastAPI(
        title="ElasticDL job server",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind authentication
    )
    app.state.services = services

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.reason}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, reason = _one_line_validation_error(exc)
        return JSONResponse({"detail": reason}, status_code=status)

    v1 = APIRouter(prefix=f"/{API_VERSION}", dependencies=[Depends(current_user)])

    @v1.get("/version")
    def version(user: str = Depends(current_user)) -> dict:
        return {
            "server": __version__,
            "api": API_VERSION,
            "platform": services.config.platform,
            "user": user,
        }

    @v1.get("/openapi.json", include_in_schema=False)
    def openapi() -> dict:
        return app.openapi()

    # ---- packages ----------------------------------------------------------------------
    @v1.post("/packages", status_code=201)
    async def add_package(
        request: Request,
        response: Response,
        user: str = Depends(current_user),
        content_length: str | None = Header(None),
    ) -> dict:
        """Body: a tarball (gzip or plain) of a model-zoo directory. 201 when the package is
        new to the caller, 200 when the caller sent these bytes before. Only the users who
        uploaded a package can read it or run jobs from it; to anyone else its id is unknown."""
        length = declared_length(content_length, services.packages.max_bytes, "the package")
        info, new = await services.packages.add(request.stream(), length, user=user)
        if not new:
            response.status_code = 200
        return info.to_dict()

    @v1.get("/packages/{package_id}")
    def package(package_id: str, user: str = Depends(current_user)) -> dict:
        return services.packages.info(package_id, user=user).to_dict()

    # ---- data ----------------------------------------------------------------------------
    @v1.put("/data/{path:path}", status_code=201)
    async def put_data(
        path: str,
        request: Request,
        user: str = Depends(current_user),
        content_length: str | None = Header(None),
        x_content_sha256: str = Header(""),
    ) -> dict:
        length = declared_length(content_length, services.data.max_bytes, "the upload")
        stored = await services.data.put(user, path, request.stream(), length, x_content_sha256)
        return stored.to_dict()

    @v1.get("/data", include_in_schema=False)
    def list_data_root(user: str = Depends(current_user)) -> dict:
        root = services.data.user_root(user)
        return services.data.listing(user, "", root)

    @v1.get("/data/{path:path}")
    def get_data(path: str, user: str = Depends(current_user)):
        """A file (``Range: bytes=N-`` resumes; ``X-Content-SHA256`` is the whole file's
        sha256) or, for a directory, its entries as JSON."""
        target = services.data.lookup(user, path)
        if target.is_dir():
            return services.data.listing(user, path, target)
        sha256 = services.data.checksum(user, path, target)
        return FileResponse(
            target,
            media_type="application/octet-stream",
            headers={CHECKSUM_HEADER: sha256},
            filename=target.name,
        )

    # ---- jobs ----------------------------------------------------------------------------
    # Job routes answer with JSONResponse: the status dicts are plain JSON already, and
    # FastAPI's validation of a returned dict costs more than the list itself (see
    # benchmarks/server/README.md).
    @v1.post(
        "/jobs",
        status_code=201,
        response_class=JSONResponse,
        responses={
            409: {"description": "The job name is taken, possibly by another user's job"},
            422: {"description": "The spec, the package or a path in it is refused"},
        },
    )
    def submit(body: JobRequest, user: str = Depends(current_user)) -> JSONResponse:
        """Submit a job; answers its status (``elasticdl.common.job_status.JobStatus``).

        Job names are global: one name is one job on this server, whoever submitted it, so a
        409 means the name is taken, possibly by another user's job (choose another
        ``job_name``); another user's job is otherwise invisible (404). ``package`` must be
        one the caller uploaded: another user's id is refused as unknown. Data and output
        paths, and ``tls_cert_file``, ``tls_key_file`` and ``tls_ca_file``, are paths in the
        caller's data directory."""
        status = services.jobs.submit(user, body)
        return JSONResponse(job_dict(status, user), status_code=201)

    @v1.get("/jobs", response_class=JSONResponse)
    def list_jobs(user: str = Depends(current_user)) -> JSONResponse:
        """``{"jobs": [JobStatus, ...]}``: the caller's jobs, oldest first."""
        return JSONResponse({"jobs": [job_dict(s, user) for s in services.jobs.list(user)]})

    @v1.get("/jobs/{name}", response_class=JSONResponse)
    def job(name: str, user: str = Depends(current_user)) -> JSONResponse:
        return JSONResponse(job_dict(services.jobs.status(user, checked_job_name(name)), user))

    @v1.delete("/jobs/{name}", response_class=JSONResponse)
    def cancel(name: str, user: str = Depends(current_user)) -> JSONResponse:
        """Cancel the job (its processes are stopped); answers its final status."""
        return JSONResponse(job_dict(services.jobs.cancel(user, checked_job_name(name)), user))

    @v1.get("/jobs/{name}/logs", response_class=StreamingResponse)
    async def logs(
        name: str,
        user: str = Depends(current_user),
        replica: str = Query("master"),
        follow: bool = Query(False),
        tail: int = Query(0, ge=0, le=100_000),
    ) -> StreamingResponse:
        checked_job_name(name)
        chunks = await run_in_threadpool(services.jobs.logs, user, name, replica, follow, tail)
        return StreamingResponse(chunks, media_type="text/plain; charset=utf-8")

    app.include_router(v1)
    app.add_middleware(
        BodyCap, path=f"/{API_VERSION}/jobs", limit=services.config.max_request_bytes
    )
    # Outermost: no body byte is read before the token is checked.
    app.add_middleware(
        RequestGate,
        tokens=services.tokens,
        body_timeout=services.config.body_timeout,
        is_public=lambda method, path: public_path(method, path, DASHBOARD_PREFIX),
    )
    # The dashboard: its pages (public, no data) and GET /v1/jobs/{name}/metrics.
    app.include_router(
        dashboard_router(lambda user, name: services.jobs.status(user, checked_job_name(name)))
    )
    return app
