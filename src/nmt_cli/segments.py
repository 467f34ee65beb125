"""What of a text goes to the model: pieces with nothing to translate pass through as given.

A piece (a line, a sentence) with no letter once its URLs and e-mail addresses are left out (an emoji, a number,
punctuation, a URL alone) has nothing a translation model could translate: LibreTranslate sends it back unchanged,
and so do `nmt translate`, the Translator and `nmt serve` (a model would make up a sentence for it).
"""

from __future__ import annotations

import re
import unicodedata

# a URL (a scheme, or www.) or an e-mail address, up to the next space
_ADDRESS = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*://|www\.)\S+|[^\s@]+@[^\s@]+\.[^\s@]+")


def translatable(text: str) -> bool:
    """Whether `text` holds a letter (Unicode category L*) outside its URLs and e-mail addresses."""
    if not any(unicodedata.category(c)[0] == "L" for c in text):
        return False
    return any(unicodedata.category(c)[0] == "L" for c in _ADDRESS.sub(" ", text))
