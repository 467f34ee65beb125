"""segments.py: what of a text is left to the model."""

from __future__ import annotations

import sys

import pytest

from nmt_cli.errors import ConfigError
from nmt_cli.segments import split, translatable


@pytest.mark.parametrize("text", ["", " ", "🙂", "🐶🐱", "42", "3,14 €", "...?!", "12:30", "https://example.org/cat",
                                  "www.example.org/dog", "ftp://x.y", "me@example.org",
                                  "(https://example.org) 🙂"])
def test_nothing_to_translate(text):
    assert not translatable(text)


@pytest.mark.parametrize("text", ["a", "A dog runs.", "100 km", "Straße", "狗", "see https://example.org", "é",
                                  "Ünïcödé 🙂", "mail me@example.org now"])
def test_something_to_translate(text):
    assert translatable(text)


PARAGRAPHS = ["A dog runs. A cat sleeps.", "  Dr. Smith came at 3 p.m. on Jan. 5!  Who?\tMe...  \n\nYes.\r\n", "", " ",
              "\n", "🙂", "one line", "Mr. Brown. 🙂 Then: https://example.org/a.b. Done.", "A.B.", "Ein Hund rennt. Eine Katze schläft."]


@pytest.mark.parametrize("text", PARAGRAPHS)
def test_split_keeps_every_character_and_alternates(text):
    pytest.importorskip("sentencex", reason="the sentences extra is not installed")
    for sentences in (False, True):
        pieces = split(text, "en", sentences)
        assert "".join(pieces) == text and len(pieces) % 2 == 1
        assert all(p.strip() == p for p in pieces[0::2]) or not sentences  # segments without edge spaces
        assert all(not p.strip() for p in pieces[1::2])  # separators: white space only


def test_split_into_sentences_and_lines():
    pytest.importorskip("sentencex", reason="the sentences extra is not installed")
    assert split("A dog runs. A cat sleeps.", "en", sentences=True) == ["A dog runs.", " ", "A cat sleeps."]
    assert split("A dog runs. A cat sleeps.", "en") == ["A dog runs. A cat sleeps."]  # lines only
    assert split("  Dr. Smith came.  Who?\n\nMe!", "en", sentences=True) == [
        "", "  ", "Dr. Smith came.", "  ", "Who?", "\n\n", "Me!"]
    assert split("Am 3. Mai kam er. Dann ging er.", "de", sentences=True)[0::2] == ["Am 3. Mai kam er.", "Dann ging er."]


def test_without_sentencex_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencex", None)  # import sentencex raises ImportError
    with pytest.raises(ConfigError, match=r"^splitting text into sentences needs sentencex: pip install "
                                          r"'nmt-cli\[sentences\]'$"):
        split("A dog runs. A cat sleeps.", "en", sentences=True)
    assert split("a\nb", "en") == ["a", "\n", "b"]  # lines need nothing
