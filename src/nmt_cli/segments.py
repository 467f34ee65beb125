"""What of a text goes to the model: its lines, optionally its sentences, and not what has nothing to translate.

A text is cut into pieces that alternate: a segment for the model, then what separates it from the next (a line
break; with sentences, the white space between two sentences; white space before the first one follows an empty
segment), so that joining the translated segments with the separators as given keeps the text's line breaks and
spacing. `nmt serve` splits its texts into sentences, as LibreTranslate does (a model trained on sentences
translates a paragraph badly: it drops what follows the first sentence); `nmt translate --split-sentences` does so
for files with a paragraph a line.

Sentences are found by sentencex (Wikimedia's; MIT; a compiled extension without dependencies, wheels for Linux,
macOS and Windows; rules for ~240 languages, with fallbacks between related languages and a generic rule set for
any other code): of pysbd, sentencex and the Moses splitter (sentence-splitter) it split the most paragraphs of
bench/tools/splitters.py right, kept every character, covers Czech (pysbd has no Czech) and is fastest
(docs/design.md#sentences).

A segment with no letter once its URLs and e-mail addresses are left out (an emoji, a number, punctuation, a URL
alone) has nothing a translation model could translate: LibreTranslate sends it back unchanged, and so do
`nmt translate`, the Translator and `nmt serve` (a model would make up a sentence for it).
"""

from __future__ import annotations

import re
import unicodedata

from nmt_cli.errors import ConfigError

LINE_BREAK = re.compile(r"(\r\n|\n|\r)")
# A word (between white space) that is a URL (a scheme, or www.) or an e-mail address, once the punctuation around it
# is left out. Matched word by word, anchored, the scheme at most 32 characters: the time stays linear in the text (a
# search over the whole text backtracked quadratically: 21 s for a 100,000-letter line, hours for 1 MB).
_URL = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]{0,31}://|www\.)\S+")
_EMAIL = re.compile(r"[^\s@]+@[^\s@]+\.[^\s@]+")
_AROUND = "\"'()[]{}<>«»‹›“”‘’„,.;:!?"
_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)
EXTRA = "sentences"  # the extra of pyproject.toml that brings sentencex (serve brings it too)


def translatable(text: str) -> bool:
    """Whether `text` holds a letter (Unicode category L*) outside its URLs and e-mail addresses."""
    if not any(unicodedata.category(c)[0] == "L" for c in text):
        return False
    return any(unicodedata.category(c)[0] == "L" for word in text.split() if not _address(word) for c in word)


def _address(word: str) -> bool:
    """Whether `word` (no white space) is a URL or an e-mail address, punctuation around it aside."""
    core = word.strip(_AROUND)
    return _URL.match(core) is not None or ("@" in core and _EMAIL.fullmatch(core) is not None)


def split(text: str, lang: str | None = None, sentences: bool = False) -> list[str]:
    """`text` -> its segments and their separators, alternating, segments at even indices: its lines and line breaks;
    with `sentences`, each line's sentences in language `lang` (a code; None: English's rules), the white space
    around them being separators too (an empty segment stands between two separators). `"".join(split(text, ...))
    == text` always."""
    lines = LINE_BREAK.split(text)
    if not sentences:
        return lines
    parts: list[str] = []

    def separator(s: str) -> None:
        if len(parts) % 2:
            parts.append(s)
        elif parts:
            parts[-1] += s
        else:
            parts.extend(("", s))

    def segment(s: str) -> None:
        if len(parts) % 2:
            parts.append("")  # two sentences with nothing between them
        parts.append(s)

    for k, piece in enumerate(lines):
        if k % 2:
            separator(piece)
            continue
        for sentence in sentences_of(piece, lang):
            lead, body, trail = _EDGES.match(sentence).groups()
            if lead:
                separator(lead)
            if body:
                segment(body)
            if trail:
                separator(trail)
    if len(parts) % 2 == 0:
        parts.append("")
    return parts


def sentences_of(line: str, lang: str | None) -> list[str]:
    """sentencex's sentences of one line (each with the white space that follows it; joined they give the line)."""
    if not line:
        return []
    return list(require().segment(lang or "en", line))


def require():
    """The sentencex module, or a ConfigError of one line saying which extra to install."""
    try:
        import sentencex
    except ImportError:
        raise ConfigError(f"splitting text into sentences needs sentencex: pip install 'nmt-cli[{EXTRA}]'") from None
    return sentencex
