"""Language identification for `POST /detect` and `source: auto`, limited to the languages the server's models
translate from.

py3langid (a maintained fork of langid.py: a naive Bayes model over byte n-grams, 97 languages, embedded in the
package, offline; BSD-3-Clause) scores the text; the scores of the candidate languages are turned into
probabilities among those candidates alone (the softmax py3langid applies with `norm_probs`, restricted), and
answered as LibreTranslate does: `[{"confidence": 0-100, "language": code}, ...]`, best first. With one
candidate there is nothing to choose: it is answered with confidence 100. Text without a letter (digits,
punctuation, emoji) says nothing about its language: the first candidate with confidence 0 (the service gives them
in LibreTranslate's order, English first), as LibreTranslate answers what it cannot detect (English, confidence 0).
"""

from __future__ import annotations

import math
import threading
import unicodedata

MAX_ANSWERS = 3  # LibreTranslate answers its three best candidates


class DetectError(Exception):
    """None of the candidate languages is known to the identifier."""


class Detector:
    def __init__(self):
        self._identifier = None
        self._lock = threading.Lock()

    def _model(self):
        with self._lock:  # loaded once, on first use (0.7 s)
            if self._identifier is None:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier

                self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
            return self._identifier

    def known(self, languages: list[str]) -> list[str]:
        labels = set(self._model().labels)
        return [code for code in languages if code in labels]

    def rank(self, text: str, candidates: list[str]) -> list[dict]:
        """The candidates most likely to be `text`'s language, best first, at most three, as LibreTranslate's
        `[{"confidence": 0-100, "language": code}]`."""
        if not any(unicodedata.category(c).startswith("L") for c in text):
            return [{"confidence": 0.0, "language": candidates[0]}]
        if len(candidates) == 1:
            return [{"confidence": 100.0, "language": candidates[0]}]
        known = self.known(candidates)
        if not known:
            raise DetectError(f"the language identifier does not know {', '.join(candidates)}")
        raw = dict(self._model().rank(text))
        # py3langid's own normalisation: scores / sqrt(bytes), softmax; here over the candidates only
        temperature = math.sqrt(len(unicodedata.normalize("NFC", text).encode("utf-8", "surrogatepass")) or 1)
        scores = {code: raw[code] / temperature for code in known}
        top = max(scores.values())
        weights = {code: math.exp(s - top) for code, s in scores.items()}
        total = sum(weights.values())
        ranked = sorted(known, key=lambda code: -weights[code])[:MAX_ANSWERS]
        return [{"confidence": round(100 * weights[code] / total, 1), "language": code} for code in ranked]
