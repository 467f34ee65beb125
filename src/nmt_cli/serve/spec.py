"""`GET /spec`: the OpenAPI 3 description of every endpoint, field and error of `nmt serve`, with this server's
limits filled in."""

from __future__ import annotations

from nmt_cli.serve.files import FORMATS
from nmt_cli.serve.service import SEARCH_FIELDS, Limits

_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
_ERROR = {"$ref": "#/components/schemas/Error"}
_Q = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
      "description": "the text, or a list of texts; a text with line breaks is translated line by line"}
_KEY = {"type": "string", "description": "an accepted key, when the server has --api-keys"}
_LANG = {"type": "string", "description": "a language code of a loaded model (GET /languages)"}
_DETECTION = {"type": "object", "properties": {"confidence": {"type": "number", "minimum": 0, "maximum": 100},
                                               "language": {"type": "string"}}}
STATUS_TEXT = {
    400: "a bad request: a missing or invalid field, an unsupported language or format, a broken file",
    403: "an invalid or missing API key; suggestions that are off",
    404: "no such endpoint or file",
    405: "a method the endpoint does not take",
    413: "over a limit: characters, lines, body or file size",
    415: "a body that is neither JSON nor a form",
    429: "over the server's --req-limit of requests a minute for this client; see Retry-After",
    500: "an internal error: the answer names a request id, which the server's log shows with the traceback",
    503: "busy (the queue is full, the request ran past the time limit, the server is stopping); see Retry-After",
    507: "the server could not store the file or suggestion (its disk is full); nothing was kept, try again later",
}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": STATUS_TEXT[c], "content": {"application/json": {"schema": _ERROR}}}
            for c in codes}


def _body(schema: dict, form: bool = True, multipart_only: bool = False) -> dict:
    content = {"multipart/form-data": {"schema": schema}}
    if not multipart_only:
        content = {"application/json": {"schema": schema}, "application/x-www-form-urlencoded": {"schema": schema},
                   **(content if form else {})}
    return {"required": True, "content": content}


def _json(description: str, schema: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def spec(limits: Limits, version: str) -> dict:
    """The OpenAPI 3.0 document."""
    options = {name: {"type": _TYPES[kind], "description": f"nmt: nmt translate's --{name.replace('_', '-')}"}
               for name, (_, kind) in SEARCH_FIELDS.items()}
    translate = {
        "type": "object", "required": ["q", "source", "target"],
        "properties": {
            "q": _Q, "source": {**_LANG, "description": "a language code, or auto (detected among the sources "
                                                      "of the models into target)"},
            "target": _LANG, "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
            "alternatives": {"type": "integer", "minimum": 0, "maximum": limits.max_beam - 1, "default": 0},
            "api_key": _KEY, "scores": {"type": "boolean", "default": False, "description": "nmt: the scores"},
            **options,
        },
    }
    one_or_list = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    translated = {
        "type": "object", "required": ["translatedText"],
        "properties": {
            "translatedText": one_or_list,
            "alternatives": {"oneOf": [{"type": "array", "items": {"type": "string"}},
                                       {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}]},
            "detectedLanguage": {"oneOf": [_DETECTION, {"type": "array", "items": _DETECTION}]},
            "scores": {"type": "array", "description": "nmt: per text, the score of the translation and of each "
                                                       "alternative", "items": {}},
        },
    }
    language = {"type": "object", "properties": {"code": {"type": "string"}, "name": {"type": "string"},
                                                 "targets": {"type": "array", "items": {"type": "string"}}}}
    paths = {
        "/translate": {"post": {
            "summary": "Translate text", "requestBody": _body(translate),
            "responses": {"200": _json("the translation", translated), **_errors(400, 403, 413, 415, 429, 500, 503)}}},
        "/languages": {"get": {"summary": "The languages the models translate from and into",
                               "responses": {"200": _json("the languages", {"type": "array", "items": language})}}},
        "/detect": {"post": {
            "summary": "Detect the language of text, among the models' source languages",
            "requestBody": _body({"type": "object", "required": ["q"],
                                  "properties": {"q": _Q, "api_key": _KEY}}),
            "responses": {"200": _json("the likeliest languages, best first", {"type": "array", "items": _DETECTION}),
                          **_errors(400, 403, 413, 415, 429, 500)}}},
        "/translate_file": {"post": {
            "summary": f"Translate a file ({', '.join(FORMATS)})",
            "requestBody": _body({"type": "object", "required": ["file", "source", "target"], "properties": {
                "file": {"type": "string", "format": "binary",
                         "description": f"at most {limits.file_bytes} bytes and {limits.file_char_limit} "
                                        "characters of text"},
                "source": _LANG, "target": _LANG, "api_key": _KEY}}, multipart_only=True),
            "responses": {"200": _json("where to download the translated file", {
                "type": "object", "properties": {"translatedFileUrl": {"type": "string"}}}),
                **_errors(400, 403, 413, 415, 429, 500, 503, 507)}}},
        "/download_file/{filename}": {"get": {
            "summary": f"Download a translated file (kept {limits.file_ttl:g} s)",
            "parameters": [{"name": "filename", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the file", "content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}, **_errors(404)}}},
        "/suggest": {"post": {
            "summary": "Suggest a better translation (kept with --suggestions FILE)",
            "requestBody": _body({"type": "object", "required": ["q", "s", "source", "target"], "properties": {
                "q": {"type": "string"}, "s": {"type": "string", "description": "the corrected translation"},
                "source": _LANG, "target": _LANG, "api_key": _KEY,
                "translation": {"type": "string", "description": "nmt: the machine translation corrected"}}}),
            "responses": {"200": _json("kept", {"type": "object", "properties": {"success": {"type": "boolean"}}}),
                          **_errors(400, 403, 413, 415, 429, 500, 507)}}},
        "/frontend/settings": {"get": {"summary": "Settings of the web page (LibreTranslate's)",
                                       "responses": {"200": _json("the settings", {"type": "object"})}}},
        "/health": {"get": {"summary": "Health check", "responses": {"200": _json("ok", {
            "type": "object", "properties": {"status": {"type": "string", "enum": ["ok"]}}})}}},
        "/info": {"get": {"summary": "nmt: version, models, counters, limits",
                          "responses": {"200": _json("the server", {"type": "object"})}}},
        "/spec": {"get": {"summary": "This document", "responses": {"200": _json("OpenAPI 3", {"type": "object"})}}},
        "/": {"get": {"summary": "The web page", "responses": {"200": {
            "description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}, **_errors(404)}}},
    }
    for path, methods in paths.items():
        allowed = {"get", "post"} - set(methods)
        if allowed and path != "/":
            for m in methods.values():
                m["responses"].setdefault("405", _errors(405)["405"])
    return {
        "openapi": "3.0.3",
        "info": {"title": "nmt serve", "version": version,
                 "description": "Machine translation over HTTP: LibreTranslate's API and nmt's options"},
        "paths": paths,
        "components": {"schemas": {"Error": {"type": "object", "required": ["error"],
                                             "properties": {"error": {"type": "string"}}}}},
    }
