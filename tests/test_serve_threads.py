"""Threads in `nmt serve`: an idle engine process's threads lent to the busy one (remote.py), and one client's
requests, one after another, decoded by one search thread (engine.py's LINGER_S). Asserted by what each search's
thread is set to and which thread answers, never by timings."""

from __future__ import annotations

import threading

import pytest
import torch

from conftest import toy_pairs
from helpers_translate import make_checkpoint
from nmt_cli.inference.translate import Translator
from nmt_cli.serve import engine as engine_module
from nmt_cli.serve.engine import Engine
from nmt_cli.serve.remote import LEND_AFTER_S, lent_threads

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = [en for en, _ in toy_pairs(8, seed=11)]


@pytest.fixture(scope="module")
def translator(tmp_path_factory, toy_tokenizer_bytes):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("threads") / "tiny.pt", toy_tokenizer_bytes, seed=4,
                           max_positions=64)
    return Translator.load(ckpt, device="cpu", max_len_a=0.0, max_len_b=6)


def answer(engine: Engine, lines: list[str]) -> tuple[str, int]:
    """Translate `lines` through `engine`: (the name of the thread that finished the request, its torch threads)."""
    seen, done = [], threading.Event()

    def finished(job) -> None:  # (in the search's thread)
        seen.append((threading.current_thread().name, torch.get_num_threads(), job.error))
        done.set()

    engine.submit(lines, engine.default, finished)
    assert done.wait(60), "no answer within 60 s"
    name, threads, error = seen[0]
    assert error is None
    return name, threads


def test_all_threads_go_to_the_one_busy_engine_once_the_others_have_been_quiet():
    quiet, recent = LEND_AFTER_S + 0.1, LEND_AFTER_S / 2
    assert lent_threads([1, 1], [None, quiet]) == [2, 1]
    assert lent_threads([1, 1], [quiet, None]) == [1, 2]
    assert lent_threads([2, 2, 2], [quiet, None, quiet]) == [2, 6, 2]
    assert lent_threads([1, 1], [None, recent]) == [1, 1]  # the other one just had work: a second client
    assert lent_threads([1, 1], [None, None]) == [1, 1]  # both busy
    assert lent_threads([1, 1], [quiet, quiet]) == [1, 1]  # nobody busy


def test_a_lone_search_takes_the_threads_lent_and_gives_them_back(translator):
    lent = [2]
    engine = Engine(translator, lend=lambda: lent[0])
    try:
        assert engine.base == 1
        _, threads = answer(engine, LINES[:2])
        assert threads == 2
        lent[0] = 1  # another engine got work: this one's own count again, from its next step
        _, threads = answer(engine, LINES[2:4])
        assert threads == 1
    finally:
        engine.close(timeout=60)


def test_an_engine_that_is_lent_nothing_keeps_its_threads(translator):
    engine = Engine(translator)
    try:
        assert answer(engine, LINES[:1])[1] == 1
    finally:
        engine.close(timeout=60)


def test_one_clients_requests_one_after_another_are_decoded_by_one_search_thread(translator, monkeypatch):
    monkeypatch.setattr(engine_module, "LINGER_S", 30.0)  # (a request never comes too late to find it waiting)
    engine = Engine(translator)
    try:
        names = {answer(engine, [line])[0] for line in LINES[:4]}
        assert len(names) == 1
        assert engine.stats()["search_groups"] == 1  # the search waits for more
    finally:
        engine.close(timeout=20)
    assert not any(t.is_alive() for t in engine.threads)  # closing does not wait for the lingering search's time
