"""What `nmt serve` answers, without the web layer: the loaded models by language pair, LibreTranslate's request
fields checked into a plan for the engine, and the engine's hypotheses shaped into LibreTranslate's response.

Every problem with a request is a `RequestError(status, one-line message)`; app.py turns it into JSON
`{"error": message}` with that status.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from nmt_cli import segments
from nmt_cli.decoding import SearchConfig
from nmt_cli.errors import ConfigError
from nmt_cli.inference.translate import Translator
from nmt_cli.segments import translatable
from nmt_cli.serve import html
from nmt_cli.serve.detect import DetectError, Detector
from nmt_cli.serve.engine import Engine, Job
from nmt_cli.serve.html import Document

# ISO 639-1 names for /languages (LibreTranslate lists a name with each code); other codes are named by their code.
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fa": "Persian", "fi": "Finnish",
    "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nb": "Norwegian",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese",
    "zh": "Chinese",
}

# nmt's own request fields (beside LibreTranslate's): `nmt translate`'s option names -> (SearchConfig field, type)
SEARCH_FIELDS = {
    "beam": ("beam", int), "lenpen": ("alpha", float), "lenpen_form": ("lp", str), "stop": ("stop", str),
    "max_len_a": ("max_len_a", float), "max_len_b": ("max_len_b", int), "min_len": ("min_len", int),
    "no_repeat_ngram": ("no_repeat_ngram", int), "sampling": ("sampling", bool), "topk": ("topk", int),
    "topp": ("topp", float), "temperature": ("temperature", float), "seed": ("seed", int),
}


class RequestError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass
class Limits:
    batch_limit: int = 64  # sentences to translate per request
    char_limit: int = 10000  # characters per request, all of q
    queue_size: int = 1024  # sentences waiting or being translated, per model
    timeout: float = 60.0  # seconds a request may take
    max_beam: int = 16  # beam and alternatives + 1 a request may ask for
    files: bool = True  # POST /translate_file is served
    file_char_limit: int = 100_000  # characters of text in a file to translate
    file_bytes: int = 10 << 20  # bytes of a file to translate
    file_ttl: float = 600.0  # seconds a translated file stays to be downloaded
    req_limit: int = 0  # requests a minute per client (ratelimit.py); 0: none
    web_ui: bool = True  # the web page at /

    @property
    def max_body(self) -> int:
        """Bytes of a request body: the character limit at the longest JSON escape (\\uXXXX\\uXXXX: 12 bytes a
        character) and room for the other fields."""
        return 12 * self.char_limit + 65536


@dataclass
class Model:
    name: str  # as given with -m
    source: str
    target: str
    engine: Engine  # a multilingual model's directions share one
    tag: str | None = None  # a multilingual model: the target's code in its `>>xx<<` tag, put before each line
    identity: bool = False  # source == target: the text comes back as given (the engine only checks options)

    @property
    def translator(self) -> Translator:
        return self.engine.translator


@dataclass
class Plan:
    """A checked /translate request: the lines to translate and how to answer."""

    model: Model
    lines: list[str]  # every line of every text
    pieces: list[list[str]]  # per text: its segments and what separates them (line breaks, spaces), alternating
    cfg: SearchConfig
    batch: bool  # q was a list
    alternatives: int
    scores: bool
    detected: dict | None  # source "auto": LibreTranslate's detectedLanguage
    slots: list[list[int | None]] = field(default_factory=list)  # per text, per segment: its index in `lines`, or
    # None for a segment that passes through as given (nothing to translate)
    docs: list[Document] | None = None  # format html: per q item its document, whose texts are the texts above


class Service:
    def __init__(self, models: list[Model], limits: Limits, api_keys: set[str] | None = None,
                 precision: str = "fp32", threads: int | None = None, suggestions: Path | None = None):
        self.models = {(m.source, m.target): m for m in models}
        self.limits, self.api_keys = limits, api_keys
        self.precision, self.threads = precision, threads
        self.suggestions = suggestions  # --suggestions FILE: where POST /suggest appends
        self.detector = Detector()

    # ------------------------------------------------------------------ languages

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every language the models translate from or into, with its targets, itself
        among them (LibreTranslate's identity translation: the text as given), in LibreTranslate's order
        (argostranslate's: English first, then by name); the targets sorted by code, as LibreTranslate sorts them."""
        codes = _ordered({c for pair in self.models for c in pair})
        return [{"code": c, "name": LANGUAGE_NAMES.get(c, c),
                 "targets": sorted({t for s, t in self.models if s == c} | {c})} for c in codes]

    def sources(self) -> list[str]:
        return _ordered({s for s, _ in self.models})

    def model(self, source: str, target: str, texts: list[str]) -> tuple[Model, dict | None]:
        """The model of a request's pair -> (model, LibreTranslate's detectedLanguage for source auto). The errors
        are LibreTranslate's texts, exactly (its tests pin them); GET /languages says what this server translates."""
        codes = {c for pair in self.models for c in pair}
        for code in (source, target):
            if code not in codes and not (code == source == "auto"):
                raise RequestError(400, f"{code[:40]} is not supported")
        detected = None
        if source == "auto":  # among the sources into target, and target itself (its text comes back as given)
            candidates = _ordered({s for s, t in self.models if t == target} | {target})
            detected = self._rank("\n".join(texts), candidates)[0]
            source = detected["language"]
        if source == target:  # an engine of the language's, for the options; nothing is translated
            some = next(m for m in self.models.values() if target in (m.source, m.target))
            return Model("identity", source, target, some.engine, identity=True), detected
        model = self.models.get((source, target))
        if model is None:
            raise RequestError(400, f"{_name(target)} is not available as a target language from {_name(source)}")
        return model, detected

    def _rank(self, text: str, candidates: list[str]) -> list[dict]:
        try:
            return self.detector.rank(text, candidates)
        except DetectError as exc:
            raise RequestError(400, f"cannot detect the language: {exc}; give source") from None

    def detect(self, fields: dict) -> list[dict]:
        """LibreTranslate's /detect: the server's source languages most likely to be q's, best first."""
        self.check_key(fields)
        items, _ = _q_items(fields.get("q"))
        text = "\n".join(items)
        if len(text) > self.limits.char_limit:
            raise RequestError(413, f"q has {len(text)} characters; this server takes at most "
                                    f"{self.limits.char_limit} per request")
        _check_text(text)
        return self._rank(text, self.sources())

    # ------------------------------------------------------------------ /translate

    def check_key(self, fields: dict) -> None:
        key = fields.get("api_key")
        if key is not None and not isinstance(key, str):  # refused as /spec says, whether keys are required or not
            raise RequestError(400, "Invalid request: api_key must be a string")
        if self.api_keys is None:
            return
        if not isinstance(key, str) or key not in self.api_keys:
            raise RequestError(403, "Invalid API key: pass api_key" if key is None else "Invalid API key")

    def plan(self, fields: dict) -> Plan:
        """Check a /translate request's fields (from JSON or a form) -> Plan; RequestError on any problem."""
        self.check_key(fields)
        items, batch = _q_items(fields.get("q"))
        source, target = _code(fields, "source"), _code(fields, "target")
        fmt = fields.get("format") or "text"
        if fmt not in ("text", "html"):
            raise RequestError(400, f"{str(fmt)[:40]} format is not supported")  # (text or html)
        alternatives = _integer(fields.get("alternatives", 0), "alternatives", 0, self.limits.max_beam - 1)
        scores = _boolean(fields.get("scores", False), "scores")
        chars = sum(len(x) for x in items)
        if chars > self.limits.char_limit:
            raise RequestError(413, f"q has {chars} characters; this server takes at most "
                                    f"{self.limits.char_limit} per request")
        for x in items:
            _check_text(x)
        docs = [html.parse(x) for x in items] if fmt == "html" else None
        texts = [t for d in docs for t in d.texts] if docs is not None else items
        model, detected = self.model(source, target, texts)
        cfg = self._search_config(model, fields, alternatives)
        return self.plan_texts(model, texts, cfg, batch=batch, alternatives=alternatives, scores=scores,
                               detected=detected, docs=docs)

    def plan_texts(self, model: Model, texts: list[str], cfg: SearchConfig, batch: bool = True,
                   alternatives: int = 0, scores: bool = False, detected: dict | None = None,
                   docs: list[Document] | None = None) -> Plan:
        """A plan for texts already checked: each split into lines and sentences (segments.py), the line breaks and
        spacing kept; the segments with nothing to translate pass through (413 past the batch limit of sentences to
        translate)."""
        pieces = [self.split(model, x) for x in texts]
        lines, slots = [], []
        for p in pieces:
            slot = []
            for segment in p[0::2]:
                slot.append(len(lines) if translatable(segment) and not model.identity else None)
                if slot[-1] is not None:
                    lines.append(segment)
            slots.append(slot)
        if len(lines) > self.limits.batch_limit:
            raise RequestError(413, f"q has {len(lines)} sentences to translate; this server takes at most "
                                    f"{self.limits.batch_limit} per request")
        if model.tag is not None:  # the request's target, whatever tag a line may start with
            lines = [f">>{model.tag}<< {line}" for line in lines]
        return Plan(model, lines, pieces, cfg, batch, alternatives, scores, detected, slots, docs)

    def split(self, model: Model, text: str) -> list[str]:
        """A text's segments (its sentences, in the model's source language) and what separates them, alternating
        (segments.split); the whole text for a language into itself, which is not translated."""
        return [text] if model.identity else segments.split(text, model.source, sentences=True)

    def sentences(self, model: Model, text: str) -> int:
        """How many segments of `text` the model translates (what the batch limit counts)."""
        return 0 if model.identity else sum(translatable(s) for s in self.split(model, text)[0::2])

    def default_config(self, model: Model) -> SearchConfig:
        return self._search_config(model, {}, 0)

    # ------------------------------------------------------------------ /suggest

    def suggestion(self, fields: dict) -> dict:
        """A checked /suggest request -> the fields of its record (nmt_cli/serve/suggestions.py)."""
        self.check_key(fields)
        texts = {}
        for name in ("q", "s", "translation"):
            value = fields.get(name)
            if name != "translation" and (value is None or value == ""):
                raise RequestError(400, f"Invalid request: missing {name} parameter")
            if value is not None and not isinstance(value, str):
                raise RequestError(400, f"Invalid request: {name} must be a string")
            if value is not None:
                if len(value) > self.limits.char_limit:
                    raise RequestError(413, f"{name} has {len(value)} characters; this server takes at most "
                                            f"{self.limits.char_limit} per request")
                _check_text(value)
            texts[name] = value
        source, target = _code(fields, "source"), _code(fields, "target")
        if source == "auto":
            raise RequestError(400, "Invalid request: a suggestion needs its source language, not auto")
        self.model(source, target, [])
        return {**texts, "source": source, "target": target}

    def _search_config(self, model: Model, fields: dict, alternatives: int) -> SearchConfig:
        default = model.engine.default
        options = {}
        for name, (attr, kind) in SEARCH_FIELDS.items():
            if name in fields and fields[name] is not None:
                value = fields[name]
                if kind is int:
                    value = _integer(value, name, 0, None)
                elif kind is float:
                    value = _number(value, name)
                elif kind is bool:
                    value = _boolean(value, name)
                elif not isinstance(value, str):
                    raise RequestError(400, f"Invalid request: {name} must be a string")
                options[attr] = value
        sampling = options.get("sampling", default.sampling)
        nbest = alternatives + 1
        if not sampling and "beam" not in options and nbest > default.beam:
            options["beam"] = nbest  # alternatives need as many beams (a beam the request gives is checked)
        options["nbest"] = nbest
        if options.get("beam", default.beam) > self.limits.max_beam:
            raise RequestError(400, f"beam {options['beam']} is above this server's limit of {self.limits.max_beam}")
        if options.get("max_len_b", 0) > 1024 or options.get("max_len_a", 0) > 10:
            raise RequestError(400, "max_len_a must be at most 10 and max_len_b at most 1024")
        if options.get("no_repeat_ngram", 0) > 32 or options.get("min_len", 0) > 1024:
            raise RequestError(400, "no_repeat_ngram must be at most 32 and min_len at most 1024")
        if options.get("sampling") is False and default.sampling:
            for name in ("topk", "topp", "temperature"):  # the server's sampling settings do not apply then
                options.setdefault(name, getattr(SearchConfig, name))
        changed = {k: v for k, v in options.items() if getattr(default, k) != v}
        try:
            return model.engine.config(**changed)
        except ConfigError as exc:
            raise RequestError(400, str(exc).splitlines()[0]) from None

    def answer(self, plan: Plan, job: Job | None) -> dict:
        """LibreTranslate's response: translatedText (a string or a list, as q), alternatives when asked,
        detectedLanguage for source auto; nmt's `scores` when asked. `job` is None when there was no line to
        translate (an HTML document without text)."""
        hyps = job.results if job is not None else []
        flat = [h for hs in hyps for h in hs]
        texts = iter(plan.model.translator.tokenizer.decode([h.tokens for h in flat])) if flat else iter(())
        per_line = [[(h.score, _one_line(next(texts))) for h in hs] for hs in hyps]
        ranks = 1 + plan.alternatives
        # per text, per rank: (translation, score)
        joined = []
        for pieces, slots in zip(plan.pieces, plan.slots, strict=True):

            def join(rank: int, slots=slots, pieces=pieces) -> tuple[str, float]:
                out, total = [], 0.0
                for k, piece in enumerate(pieces):
                    if k % 2 or slots[k // 2] is None:
                        out.append(piece)  # a line break, or a segment with nothing to translate, as sent
                    else:
                        hs = per_line[slots[k // 2]]
                        score, text = hs[min(rank, len(hs) - 1)]
                        out.append(text)
                        total += score
                return "".join(out), total

            joined.append([join(r) for r in range(ranks)])
        if plan.docs is not None:  # each q item: its document with its texts translated
            items, first = [], 0
            for doc in plan.docs:
                own = joined[first:first + len(doc.texts)]
                first += len(doc.texts)
                items.append([(doc.render([t[r][0] for t in own]), sum(t[r][1] for t in own)) for r in range(ranks)])
            joined = items
        translated = [j[0][0] for j in joined]
        alternatives = [[text for text, _ in j[1:]] for j in joined]
        scores = [[round(s, 4) for _, s in j] for j in joined]
        if plan.batch:
            body: dict = {"translatedText": translated}
            if plan.alternatives:
                body["alternatives"] = alternatives
            if plan.detected:
                body["detectedLanguage"] = [plan.detected] * len(translated)
            if plan.scores:
                body["scores"] = scores
        else:
            body = {"translatedText": translated[0]}
            if plan.alternatives:
                body["alternatives"] = alternatives[0]
            if plan.detected:
                body["detectedLanguage"] = plan.detected
            if plan.scores:
                body["scores"] = scores[0]
        return body

    # ------------------------------------------------------------------ /info

    def info(self) -> dict:
        from nmt_cli import __version__

        models = []
        for (s, t), m in sorted(self.models.items()):
            tr = m.translator
            models.append({
                "model": m.name, "source": s, "target": t, "tag": m.tag and f">>{m.tag}<<", "device": str(tr.device),
                "precision": self.precision,
                "parameters": m.engine.parameters,
                "defaults": {name: getattr(m.engine.default, attr) for name, (attr, _) in SEARCH_FIELDS.items()},
                "max_tokens": m.engine.max_tokens, **m.engine.stats(),
            })
        lim = self.limits
        return {"version": __version__, "models": models, "languages": self.languages(), "threads": self.threads,
                "limits": {"batch_limit": lim.batch_limit, "char_limit": lim.char_limit,
                           "queue_size": lim.queue_size, "timeout": lim.timeout, "max_beam": lim.max_beam,
                           "max_alternatives": lim.max_beam - 1, "max_body_bytes": lim.max_body,
                           "files": lim.files, "file_char_limit": lim.file_char_limit,
                           "file_bytes": lim.file_bytes, "file_ttl": lim.file_ttl},
                "suggestions": self.suggestions is not None,
                "api_key_required": self.api_keys is not None}


def _q_items(q) -> tuple[list[str], bool]:
    """q -> (its items, whether it was a list)."""
    if q is None or q == "":
        raise RequestError(400, "Invalid request: missing q parameter")
    if q == []:
        raise RequestError(400, "Invalid request: q is an empty list")
    if isinstance(q, str):
        return [q], False
    if isinstance(q, list) and all(isinstance(x, str) for x in q):
        return q, True
    raise RequestError(400, "Invalid request: q must be a string or a list of strings")


def _code(fields: dict, name: str) -> str:
    value = fields.get(name)
    if value is None or value == "":
        raise RequestError(400, f"Invalid request: missing {name} parameter")
    if not isinstance(value, str):
        raise RequestError(400, f"Invalid request: {name} must be a language code (a string)")
    return value


def _ordered(codes) -> list[str]:
    """Language codes in LibreTranslate's order (argostranslate's): English first, then by name."""
    return sorted(codes, key=lambda c: (c != "en", LANGUAGE_NAMES.get(c, c), c))


def _name(code: str) -> str:
    """LibreTranslate's way of naming a language in its messages: "German (de)"."""
    return f"{LANGUAGE_NAMES.get(code, code[:40])} ({code[:40]})"


def _integer(value, name: str, low: int, high: int | None) -> int:
    """An int from JSON (not a bool, not a fraction) or a form's decimal string."""
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,9}\s*", value):
        value = int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e9:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"Invalid request: {name} must be an integer")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise RequestError(400, f"Invalid request: {name} must be {bound}, got {value}")
    return value


def _number(value, name: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise RequestError(400, f"Invalid request: {name} must be a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(400, f"Invalid request: {name} must be a number")
    return float(value)


def _boolean(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "false", "0"):
        return value.lower() in ("true", "1")
    raise RequestError(400, f"Invalid request: {name} must be true or false")


def _check_text(text: str) -> None:
    """Text the tokenizer can take: a JSON \\ud800 escape gives an unpaired surrogate, which UTF-8 cannot hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(400, f"Invalid request: q holds invalid Unicode ({exc.reason})") from None


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ") if ("\n" in text or "\r" in text) else text


def directions(langs: dict, tags: list[str], pair: tuple[str, str] | None = None) -> list[tuple[str, str, str | None]]:
    """The (source, target, tag code) a model serves. One direction: its pair, no tag. A multilingual model (its
    tokenizer's `>>xx<<` codes, `tags`): one per target it knows, named by its ISO 639-1 code where there is one
    (`>>fra<<` serves `fr`, as LibreTranslate's clients ask), from each source its checkpoint records (nmt's own:
    the directions it was trained on; an imported OPUS-MT model: its source language) or `pair`'s source (--langs
    en-mul: every target; --langs en-fr: that one)."""
    from nmt_cli.languages import base, resolve

    src, tgt = pair or (langs.get("src"), langs.get("tgt"))
    if not tags:
        return [(src, tgt, None)] if src and tgt else []
    names = [base(code) for code in tags]
    codes = {code: name if names.count(name) == 1 else code for code, name in zip(tags, names, strict=True)}
    if pair is not None and pair[1] != "mul":
        return [(pair[0], pair[1], resolve(pair[1], tags))]  # (a ConfigError naming the model's languages)
    trained = [tuple(d) for d in langs.get("directions", [])] if pair is None else []
    if trained:
        return [(s, codes[resolve(t, tags)], resolve(t, tags)) for s, t in trained]
    if not src or src == "mul":
        return []
    return [(src, name, code) for code, name in codes.items() if name != src]
