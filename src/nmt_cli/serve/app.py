"""The HTTP layer of `nmt serve` (Starlette): LibreTranslate's endpoints and nmt's /health and /info.

Bodies are read up to `Limits.max_body` bytes (413 past it) and parsed strictly: JSON (an object, UTF-8), a
urlencoded form or a multipart form (LibreTranslate's clients send all three). Every error is JSON
`{"error": "one line"}`: 400 bad request, 403 API key, 404/405 no such endpoint or method, 413 too large, 415 a
body of another type, 503 busy (with Retry-After: the queue is full, or the request ran past the time limit),
500 a failure of the search (the server goes on).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nmt_cli.serve.engine import Job, QueueFull, Stopping
from nmt_cli.serve.service import RequestError, Service

MAX_FIELDS = 64  # fields of a form


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise RequestError(413 if length.isdigit() else 400,
                           f"the request body is over this server's limit of {limit} bytes" if length.isdigit()
                           else "invalid Content-Length")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the request body is over this server's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_fields(request: Request, limit: int) -> dict:
    """A request's fields from JSON, a urlencoded form or a multipart form; RequestError when malformed."""
    body = await read_body(request, limit)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        return await _form(request, body, ctype)
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise RequestError(415, f"content type {ctype[:60]} is not supported; send application/json or a form")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"invalid request: the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        fields = json.loads(text)
    except RecursionError:
        raise RequestError(400, "invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise RequestError(400, f"invalid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(fields, dict):
        raise RequestError(400, "invalid request: the body must be a JSON object")
    return fields


async def _form(request: Request, body: bytes, ctype: str) -> dict:
    pairs: list[tuple[str, str]] = []
    if ctype == "multipart/form-data":
        from starlette.formparsers import MultiPartException, MultiPartParser

        async def stream():
            yield body
            yield b""

        try:
            form = await MultiPartParser(request.headers, stream(), max_files=0, max_fields=MAX_FIELDS).parse()
        except (MultiPartException, UnicodeDecodeError, ValueError) as exc:
            raise RequestError(400, f"invalid multipart form: {str(exc).splitlines()[0] if str(exc) else 'malformed'}"
                               ) from None
        for k, v in form.multi_items():
            if not isinstance(v, str):
                raise RequestError(400, "invalid request: files are not supported; send q as a field")
            pairs.append((k, v))
    else:
        try:
            pairs = parse_qsl(body.decode("ascii"), keep_blank_values=True, encoding="utf-8", errors="strict",
                              max_num_fields=MAX_FIELDS)
        except UnicodeDecodeError:
            raise RequestError(400, "invalid request: the form is not valid UTF-8") from None
        except ValueError as exc:
            raise RequestError(400, f"invalid form: {str(exc).splitlines()[0]}") from None
    fields: dict = {}
    for k, v in pairs:
        if k == "q" and "q" in fields:  # q=a&q=b: a list, as JSON's "q": ["a", "b"]
            fields["q"] = (fields["q"] if isinstance(fields["q"], list) else [fields["q"]]) + [v]
        else:
            fields[k] = v
    return fields


def build_app(service: Service, on_shutdown=None) -> Starlette:
    limits = service.limits

    async def translate(request: Request) -> JSONResponse:
        fields = await read_fields(request, limits.max_body)
        plan = service.plan(fields)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def finished(job: Job) -> None:  # in the engine's thread
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(job))

        try:
            job = plan.model.engine.submit(plan.lines, plan.cfg, finished)
        except QueueFull as exc:
            raise RequestError(503, str(exc), {"Retry-After": str(exc.retry_after)}) from None
        except Stopping as exc:
            raise RequestError(503, str(exc), {"Retry-After": "5"}) from None
        try:
            job = await asyncio.wait_for(asyncio.shield(future), limits.timeout)
        except asyncio.TimeoutError:
            plan.model.engine.cancel(job)
            raise RequestError(503, f"the translation took longer than this server's limit of {limits.timeout:g} s",
                               {"Retry-After": "5"}) from None
        if job.error is not None:
            return error(500, f"the translation failed: {job.error}")
        return JSONResponse(service.answer(plan, job))

    async def languages(request: Request) -> JSONResponse:
        return JSONResponse(service.languages())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def info(request: Request) -> JSONResponse:
        # on a worker thread: an engine process's counters take a pipe round trip (up to a second when it is
        # stopped or starved), which must not hold up the other requests
        return JSONResponse(await run_in_threadpool(service.info))

    async def settings(request: Request) -> JSONResponse:
        """LibreTranslate's /frontend/settings, which some clients read for the limits."""
        langs = service.languages()
        first = langs[0] if langs else {"code": "auto", "name": "Auto Detect"}
        target = next((lang for lang in langs if lang["code"] in first.get("targets", [])), first)
        return JSONResponse({
            "charLimit": limits.char_limit, "batchLimit": limits.batch_limit, "frontendTimeout": 500,
            "apiKeys": service.api_keys is not None, "keyRequired": service.api_keys is not None,
            "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": first["code"], "name": first["name"]},
                         "target": {"code": target["code"], "name": target["name"]}},
        })

    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error(exc.status, exc.message, exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = {404: f"no endpoint {request.url.path[:80]}; see GET /info",
                   405: f"method {request.method} is not allowed on {request.url.path[:80]}"}.get(
            exc.status_code, str(exc.detail))
        return error(exc.status_code, message, getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return error(500, f"internal error: {type(exc).__name__}")

    @asynccontextmanager
    async def lifespan(app):
        yield
        if on_shutdown is not None:
            await asyncio.get_running_loop().run_in_executor(None, on_shutdown)

    return Starlette(
        routes=[
            Route("/translate", translate, methods=["POST"]),
            Route("/languages", languages, methods=["GET", "POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/info", info, methods=["GET"]),
            Route("/frontend/settings", settings, methods=["GET"]),
        ],
        exception_handlers={RequestError: request_error, HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
