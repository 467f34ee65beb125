"""`format: html`: the text between the tags is translated; tags, attributes, comments and entities are kept as
written.

Python's own HTML parser (`html.parser`, lenient like a browser: broken markup is read, never refused) splits the
document into markup and text. Every piece of the source is kept byte for byte except the translatable texts: a
run of text between two tags, with something to translate (a letter outside URLs: segments.py), outside `script`, `style`, `code`, `kbd`,
`samp`, `var` and any element marked `translate="no"` (HTML's own attribute for it). A text's leading and
trailing white space is kept; inside it, white space (line breaks included) is one space, as a browser shows it.
The translation is escaped back: `&`, `<`, `>` as entities, and a character the source wrote as an entity
(`&nbsp;`, `&copy;`, `&#8217;`) as that same entity.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from nmt_cli.segments import translatable

SKIPPED = frozenset({"script", "style", "code", "kbd", "samp", "var"})
_WHITE = " \t\n\r\f"  # HTML's white space (not &nbsp;)
_SPACE = re.compile(f"[{_WHITE}]+")
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


@dataclass
class Document:
    parts: list = field(default_factory=list)  # raw markup (str), or the index (int) of a text in `texts`
    texts: list[str] = field(default_factory=list)  # the texts to translate (entities decoded)
    entities: list[dict[str, str]] = field(default_factory=list)  # per text: character -> the entity it was

    def render(self, translations: list[str]) -> str:
        """The document with each text replaced by its translation (in the order of `texts`)."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                written = self.entities[part]
                out.append("".join(written.get(c) or _ESCAPES.get(c, c) for c in translations[part]))
        return "".join(out)


class _Tokens(HTMLParser):
    """Records where each token starts in the source and whether it is translatable text."""

    def __init__(self, source: str):
        super().__init__(convert_charrefs=False)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", source)]
        self.tokens: list[tuple[int, str]] = []  # (offset, "text" | "entity" | "markup")
        self.skipping: list[list] = []  # open elements whose text is not translated: [tag, depth]

    def _at(self, kind: str) -> None:
        line, col = self.getpos()
        if kind != "markup" and self.skipping:
            kind = "markup"
        self.tokens.append((self.line_starts[line - 1] + col, kind))

    def handle_starttag(self, tag, attrs):
        self._at("markup")
        if self.skipping and self.skipping[-1][0] == tag:
            self.skipping[-1][1] += 1
        elif tag in SKIPPED or any(k == "translate" and (v or "").strip().lower() == "no" for k, v in attrs):
            self.skipping.append([tag, 1])

    def handle_startendtag(self, tag, attrs):
        self._at("markup")

    def handle_endtag(self, tag):
        self._at("markup")
        if self.skipping and self.skipping[-1][0] == tag:
            self.skipping[-1][1] -= 1
            if not self.skipping[-1][1]:
                self.skipping.pop()

    def handle_data(self, data):
        self._at("text")

    def handle_entityref(self, name):
        self._at("entity")

    def handle_charref(self, name):
        self._at("entity")

    def handle_comment(self, data):
        self._at("markup")

    def handle_decl(self, decl):
        self._at("markup")

    def handle_pi(self, data):
        self._at("markup")

    def unknown_decl(self, data):
        self._at("markup")


def parse(source: str) -> Document:
    """Split an HTML document (or fragment) into markup kept as written and texts to translate."""
    parser = _Tokens(source)
    parser.feed(source)
    parser.close()
    tokens = parser.tokens + [(len(source), "end")]
    doc = Document()
    run_start, entities = None, {}
    for k, (offset, kind) in enumerate(tokens[:-1]):
        end = tokens[k + 1][0]
        if end <= offset:
            continue
        raw = source[offset:end]
        if kind == "markup":
            _flush(doc, source, run_start, offset, entities)
            run_start, entities = None, {}
            doc.parts.append(raw)
            continue
        if run_start is None:
            run_start = offset
        if kind == "entity":
            char = html.unescape(raw)
            if len(char) == 1 and char != raw:
                entities[char] = raw.rstrip() if raw.rstrip().endswith(";") else raw
    _flush(doc, source, run_start, len(source), entities)
    return doc


def _flush(doc: Document, source: str, start: int | None, end: int, entities: dict[str, str]) -> None:
    if start is None:
        return
    raw = source[start:end]
    text = html.unescape(raw)
    stripped = text.strip(_WHITE)
    if not translatable(stripped):
        doc.parts.append(raw)
        return
    lead = raw[:len(raw) - len(raw.lstrip(_WHITE))]
    trail = raw[len(raw.rstrip(_WHITE)):]
    doc.parts += [lead, len(doc.texts), trail]
    doc.texts.append(_SPACE.sub(" ", stripped))
    doc.entities.append(dict(entities))
