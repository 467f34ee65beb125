"""segments.py: what of a text is left to the model."""

from __future__ import annotations

import pytest

from nmt_cli.segments import translatable


@pytest.mark.parametrize("text", ["", " ", "🙂", "🐶🐱", "42", "3,14 €", "...?!", "12:30", "https://example.org/cat",
                                  "www.example.org/dog", "ftp://x.y", "me@example.org",
                                  "(https://example.org) 🙂"])
def test_nothing_to_translate(text):
    assert not translatable(text)


@pytest.mark.parametrize("text", ["a", "A dog runs.", "100 km", "Straße", "狗", "see https://example.org", "é",
                                  "Ünïcödé 🙂", "mail me@example.org now"])
def test_something_to_translate(text):
    assert translatable(text)
