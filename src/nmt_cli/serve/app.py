"""The HTTP layer of `nmt serve` (Starlette): LibreTranslate's endpoints (/translate, /detect, /translate_file,
/download_file, /suggest, /languages, /spec, /frontend/settings, /health), nmt's /info, and the web page at /.

Bodies are read up to `Limits.max_body` bytes (413 past it) and parsed strictly: JSON (an object, UTF-8), a
urlencoded form or a multipart form (LibreTranslate's clients send all three). Every error is JSON
`{"error": "one line"}`: 400 bad request, 403 API key, 404/405 no such endpoint or method, 413 too large, 415 a
body of another type, 503 busy (with Retry-After: the queue is full, or the request ran past the time limit),
500 an internal error or a failed search, with a request id that the log shows beside the traceback (the server
goes on).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import traceback
import uuid
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl, quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nmt_cli.serve import files
from nmt_cli.serve.engine import Job, QueueFull, Stopping
from nmt_cli.serve.files import FileStore
from nmt_cli.serve.page import Page
from nmt_cli.serve.ratelimit import RateLimiter
from nmt_cli.serve.service import Plan, RequestError, Service
from nmt_cli.serve.spec import spec
from nmt_cli.serve.suggestions import Suggestions

MAX_FIELDS = 64  # fields of a form


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def storage_error(what: str, exc: OSError) -> RequestError:
    """507 for a file or suggestion the server could not store (a full disk): nothing of it was kept."""
    return RequestError(507, f"the server could not store {what}: {exc.strerror or exc}; nothing was kept, "
                             "try again later")


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
        form = await _multipart(request, body, max_files=0)
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


async def _multipart(request: Request, body: bytes, max_files: int):
    """`body` parsed as a multipart form (starlette's parser, at most `max_files` files), or a 400 saying why not."""
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream():
        yield body
        yield b""

    try:
        return await MultiPartParser(request.headers, stream(), max_files=max_files, max_fields=MAX_FIELDS).parse()
    except (MultiPartException, UnicodeDecodeError, ValueError) as exc:
        raise RequestError(400, f"invalid multipart form: {str(exc).splitlines()[0] if str(exc) else 'malformed'}"
                           ) from None


async def read_upload(request: Request, limit: int) -> tuple[dict, tuple[str, bytes] | None]:
    """A multipart form with one file (POST /translate_file) -> (its fields, (file name, bytes) or None)."""
    body = await read_body(request, limit)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "multipart/form-data":
        raise RequestError(415 if ctype else 400, "Invalid request: send the file in a multipart/form-data body")
    from starlette.datastructures import UploadFile

    form = await _multipart(request, body, max_files=1)
    fields, upload = {}, None
    for k, v in form.multi_items():
        if isinstance(v, UploadFile):
            if k == "file":
                upload = (v.filename or "", await v.read())
            await v.close()
        else:
            fields[k] = v
    return fields, upload


def build_app(service: Service, on_shutdown=None) -> Starlette:
    limits = service.limits
    store = FileStore(limits.file_ttl) if limits.files else None
    suggestions = Suggestions(service.suggestions) if service.suggestions is not None else None
    page = Page()
    limiter = RateLimiter(limits.req_limit) if limits.req_limit else None

    def spend(request: Request, fields: dict, cost: int = 1) -> None:
        """--req-limit: count a request against its client (ratelimit.py), or a 429 with LibreTranslate's text."""
        if limiter is None:
            return
        key = fields.get("api_key") if service.api_keys is not None else None
        address = request.client.host if request.client else ""
        wait = limiter.take(f"key {key}" if isinstance(key, str) and key else f"address {address}", cost)
        if wait is not None:
            raise RequestError(429, f"Slowdown: {limits.req_limit} per 1 minute (this server's --req-limit; the "
                                    f"request counts {cost}; retry in {math.ceil(wait)} s)",
                               {"Retry-After": str(max(1, math.ceil(wait)))})

    async def run(plan: Plan) -> Job | None:
        """Translate a plan's lines on its model's engine -> the finished job (None when there is no line)."""
        if not plan.lines:
            return None
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
            raise SearchFailed(job.error)
        return job

    async def translate(request: Request) -> JSONResponse:
        fields = await read_fields(request, limits.max_body)
        q = fields.get("q")
        spend(request, fields, max(1, len(q)) if isinstance(q, list) else 1)  # (as LibreTranslate counts)
        plan = service.plan(fields)
        return JSONResponse(service.answer(plan, await run(plan)))

    async def detect(request: Request) -> JSONResponse:
        fields = await read_fields(request, limits.max_body)
        spend(request, fields)
        return JSONResponse(await run_in_threadpool(service.detect, fields))

    async def translate_file(request: Request) -> JSONResponse:
        if store is None:
            raise RequestError(403, "Files translation are disabled on this server.")
        fields, upload = await read_upload(request, limits.file_bytes + 65536)
        spend(request, fields, max(1, len(upload[1]) // limits.char_limit) if upload else 1)  # (as LibreTranslate)
        service.check_key(fields)
        if upload is None:
            raise RequestError(400, "Invalid request: missing file parameter")
        name, data = upload
        source, target = service_code(fields, "source"), service_code(fields, "target")
        ext = files.extension(name)
        if ext not in files.FORMATS:
            # LibreTranslate's text; /frontend/settings' supportedFilesFormat lists the formats
            raise RequestError(400, "Invalid request: file format not supported")
        if not data:
            raise RequestError(400, "Invalid request: empty file")
        if len(data) > limits.file_bytes:
            raise RequestError(413, f"the file has {len(data)} bytes; this server takes at most {limits.file_bytes}")
        try:
            doc = await run_in_threadpool(files.read, ext, data)
        except files.FileError as exc:
            raise RequestError(400, f"Invalid request: {exc}") from None
        chars = sum(len(t) for t in doc.texts)
        if chars > limits.file_char_limit:
            raise RequestError(413, f"the file has {chars} characters of text; this server takes at most "
                                    f"{limits.file_char_limit} a file")
        model, _ = service.model(source, target, doc.texts)
        cfg = service.default_config(model)
        out = []
        for chunk in _chunks(doc.texts, limits.batch_limit, limits.char_limit, lambda t: service.sentences(model, t)):
            plan = service.plan_texts(model, chunk, cfg)
            out += service.answer(plan, await run(plan))["translatedText"]
        data = await run_in_threadpool(doc.build, out)
        try:
            name = await run_in_threadpool(store.add, data, name, model.target)
        except OSError as exc:
            raise storage_error("the translated file", exc) from None
        return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", filename=name))})

    async def download_file(request: Request) -> Response:
        found = store.get(request.path_params["filename"]) if store is not None else None
        if found is None:
            raise RequestError(404, "no such file: translated files are kept "
                                    f"{limits.file_ttl:g} s" if store is not None else
                               "Files translation are disabled on this server.")
        path, download = found
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # removed meanwhile
            raise RequestError(404, "no such file") from None
        ext = files.extension(download)
        return Response(data, media_type=files.MEDIA_TYPES.get(ext, "application/octet-stream"),
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(download)}"})

    async def suggest(request: Request) -> JSONResponse:
        fields = await read_fields(request, limits.max_body)
        spend(request, fields)
        if suggestions is None:
            raise RequestError(403, "Suggestions are disabled on this server.")
        record = service.suggestion(fields)
        try:
            await run_in_threadpool(lambda: suggestions.add(**record))
        except OSError as exc:
            raise storage_error("the suggestion", exc) from None
        return JSONResponse({"success": True})

    async def languages(request: Request) -> JSONResponse:
        return JSONResponse(service.languages())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def info(request: Request) -> JSONResponse:
        # on a worker thread: an engine process's counters take a pipe round trip (up to a second when it is
        # stopped or starved), which must not hold up the other requests
        return JSONResponse(await run_in_threadpool(service.info))

    async def openapi(request: Request) -> JSONResponse:
        from nmt_cli import __version__

        return JSONResponse(spec(limits, __version__))

    async def settings(request: Request) -> JSONResponse:
        """LibreTranslate's /frontend/settings: every key its web page reads, and nmt's own for nmt's page."""
        return JSONResponse(frontend_settings(service, store is not None, suggestions is not None))

    async def index(request: Request) -> Response:
        return asset_response("index.html")

    async def asset(request: Request) -> Response:
        return asset_response(request.path_params["name"])

    def asset_response(name: str) -> Response:
        if not limits.web_ui:
            raise RequestError(404, "the web page is off on this server (--disable-web-ui); the API answers")
        content, media_type, headers = page.asset(name)
        return Response(content, media_type=media_type, headers=headers)

    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error(exc.status, exc.message, exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = {404: f"no endpoint {request.url.path[:80]}; see GET /spec",
                   405: f"method {request.method} is not allowed on {request.url.path[:80]}"}.get(
            exc.status_code, str(exc.detail))
        return error(exc.status_code, message, getattr(exc, "headers", None))

    @asynccontextmanager
    async def lifespan(app):
        sweeper = asyncio.create_task(_sweep(store)) if store is not None else None
        yield
        if sweeper is not None:
            sweeper.cancel()
            store.close()
        if on_shutdown is not None:
            await asyncio.get_running_loop().run_in_executor(None, on_shutdown)

    return Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/static/{name}", asset, methods=["GET"]),
            Route("/translate", translate, methods=["POST"]),
            Route("/detect", detect, methods=["POST"]),
            Route("/translate_file", translate_file, methods=["POST"]),
            Route("/download_file/{filename}", download_file, methods=["GET"], name="download_file"),
            Route("/suggest", suggest, methods=["POST"]),
            Route("/languages", languages, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/info", info, methods=["GET"]),
            Route("/spec", openapi, methods=["GET"]),
            Route("/frontend/settings", settings, methods=["GET"]),
        ],
        middleware=[Middleware(InternalErrors)],
        exception_handlers={RequestError: request_error, HTTPException: http_error},
        lifespan=lifespan,
    )


class SearchFailed(Exception):
    """The engine failed a request's search (its traceback is in the log, from the engine)."""


class InternalErrors:
    """Any exception a request raises past the handlers: a 500 `{"error": "internal error (request id ID): ..."}`
    with the header X-Request-Id, and the traceback on stderr under the same id. The server goes on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            rid = uuid.uuid4().hex[:16]
            what = f"{scope.get('method')} {scope.get('path', '')[:200]}"
            if isinstance(exc, SearchFailed):
                reason = f"the translation failed: {exc}"
                print(f"nmt serve: internal error, request id {rid}: {what}: {reason}", file=sys.stderr, flush=True)
            else:
                reason = type(exc).__name__
                print(f"nmt serve: internal error, request id {rid}: {what}\n{traceback.format_exc()}",
                      file=sys.stderr, end="", flush=True)
            if not started:
                response = error(500, f"internal error (request id {rid}): {reason}", {"X-Request-Id": rid})
                await response(scope, receive, send)


def service_code(fields: dict, name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"Invalid request: missing {name} parameter")
    return value


def frontend_settings(service: Service, files_on: bool, suggestions_on: bool) -> dict:
    """LibreTranslate's /frontend/settings (the keys its page reads: charLimit, frontendTimeout, apiKeys,
    keyRequired, suggestions, filesTranslation, supportedFilesFormat, language.source/target) and nmt's (batchLimit,
    alternativesLimit, fileCharLimit, autoDetect)."""
    langs = service.languages()
    sources = service.sources()
    auto = len(sources) > 1
    source_code = "auto" if auto else sources[0]
    first = next(lang for lang in langs if lang["code"] == sources[0])
    target_code = next(t for t in first["targets"] if t != sources[0])  # (not the source's own)
    names = {lang["code"]: lang["name"] for lang in langs}
    limits = service.limits
    return {
        "charLimit": limits.char_limit, "frontendTimeout": 500,
        "apiKeys": service.api_keys is not None, "keyRequired": service.api_keys is not None,
        "suggestions": suggestions_on, "filesTranslation": files_on,
        "supportedFilesFormat": list(files.FORMATS) if files_on else [],
        "language": {"source": {"code": source_code, "name": "Auto Detect" if auto else names[source_code]},
                     "target": {"code": target_code, "name": names[target_code]}},
        "batchLimit": limits.batch_limit, "alternativesLimit": limits.max_beam - 1,
        "fileCharLimit": limits.file_char_limit, "autoDetect": auto,
    }


def _chunks(texts: list[str], max_lines: int, max_chars: int, sentences):
    """Texts in groups that each fit one request's limits, `sentences(text)` counting a text's sentences to translate
    (a text over them alone is a 413)."""
    chunk, lines, chars = [], 0, 0
    for t in texts:
        n = sentences(t)
        if n > max_lines or len(t) > max_chars:
            raise RequestError(413, f"a paragraph of the file has {len(t)} characters and {n} sentences; this server "
                                    f"takes at most {max_chars} characters and {max_lines} sentences at a time")
        if chunk and (lines + n > max_lines or chars + len(t) > max_chars):
            yield chunk
            chunk, lines, chars = [], 0, 0
        chunk.append(t)
        lines, chars = lines + n, chars + len(t)
    if chunk:
        yield chunk


async def _sweep(store: FileStore) -> None:
    """Remove expired translated files even when no request comes."""
    while True:
        await asyncio.sleep(min(store.ttl / 2, 30))
        await run_in_threadpool(store.sweep)
