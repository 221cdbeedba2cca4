"""The job server's FastAPI application: thin routes over the plain classes of this package
(``TokenStore``, ``PackageStore``, ``DataStore``, ``JobService``).

Every route requires a bearer token (``deps.current_user``), the OpenAPI schema included
(``GET /v1/openapi.json``); FastAPI's unauthenticated /docs, /redoc and /openapi.json are off.
Errors are ``{"detail": "<one line>"}`` with a 4xx status.
"""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from elasticdl.client.version import __version__
from elasticdl.server.auth import TokenStore
from elasticdl.server.config import ServerConfig
from elasticdl.server.deps import current_user
from elasticdl.server.errors import ServerError

API_VERSION = "v1"


@dataclasses.dataclass
class Services:
    config: ServerConfig
    tokens: TokenStore


def build_services(config: ServerConfig) -> Services:
    config.make_dirs()
    return Services(config=config, tokens=TokenStore(config.tokens_file))


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
    if first.get("type") == "extra_forbidden":
        return 422, f"unknown field {where!r} in the request; remove it"
    if first.get("type") == "missing":
        return 422, f"field {where!r} is required"
    return 422, f"field {where!r}: {first.get('msg', 'invalid')}"


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
        if app.openapi_schema is None:
            app.openapi_schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes
            )
        return app.openapi_schema

    app.include_router(v1)
    return app
