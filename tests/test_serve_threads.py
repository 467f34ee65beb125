"""One client's requests, one after another, are decoded by one running search of `nmt serve`'s engine (engine.py's
LINGER_S): asserted by which thread answers and how many searches run, never by timings."""

from __future__ import annotations

import threading

import pytest

from conftest import toy_pairs
from helpers_translate import make_checkpoint
from nmt_cli.inference.translate import Translator
from nmt_cli.serve import engine as engine_module
from nmt_cli.serve.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = [en for en, _ in toy_pairs(8, seed=11)]


@pytest.fixture(scope="module")
def translator(tmp_path_factory, toy_tokenizer_bytes):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("threads") / "tiny.pt", toy_tokenizer_bytes, seed=4,
                           max_positions=64)
    return Translator.load(ckpt, device="cpu", max_len_a=0.0, max_len_b=6)


def answer(engine: Engine, lines: list[str]) -> str:
    """Translate `lines` through `engine`: the name of the thread that finished the request (its search's)."""
    seen, done = [], threading.Event()

    def finished(job) -> None:  # (in the search's thread)
        seen.append((threading.current_thread().name, job.error))
        done.set()

    engine.submit(lines, engine.default, finished)
    assert done.wait(60), "no answer within 60 s"
    name, error = seen[0]
    assert error is None
    return name


def test_one_clients_requests_one_after_another_are_decoded_by_one_search_thread(translator, monkeypatch):
    monkeypatch.setattr(engine_module, "LINGER_S", 600.0)  # (a request never comes too late to find it waiting)
    engine = Engine(translator)
    try:
        names = {answer(engine, [line]) for line in LINES[:4]}
        assert len(names) == 1
        assert engine.stats()["search_groups"] == 1  # the search waits for more
    finally:
        engine.close(timeout=60)
    assert not any(t.is_alive() for t in engine.threads)  # closing does not wait for the lingering search's time
