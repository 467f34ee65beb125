"""The serve engine shares its decoding fairly between requests with different search settings: a client that keeps
sending requests with settings of its own (length penalties, seeds, a long minimum length) does not hold back the
clients that send the server's default settings. Fairness is asserted by the order of turns (turns.py) under a clock
the test moves, never by latencies measured on the machine: those follow whatever else it runs."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import toy_pairs
from helpers_translate import make_checkpoint
from nmt_cli.inference.translate import Translator
from nmt_cli.serve.engine import Engine
from nmt_cli.serve.turns import QUANTUM_S, Turns

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = [en for en, _ in toy_pairs(60, seed=5)]
DEFAULT_CLIENTS = 4  # clients sending the default settings, one short request after another
REQUESTS = 8  # per default client and phase


@pytest.fixture(scope="module")
def engine(tmp_path_factory, toy_tokenizer_bytes):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("fair") / "tiny.pt", toy_tokenizer_bytes, seed=3,
                           max_positions=128)
    engine = Engine(Translator.load(ckpt, device="cpu"), max_queue=4096)
    yield engine
    engine.close(timeout=60)


def run_phase(engine: Engine, odd_client: bool) -> list[float]:
    """DEFAULT_CLIENTS clients each send REQUESTS one-line requests with the default settings, each after the
    previous one's answer; with `odd_client`, one more client meanwhile sends 8-line requests whose settings change
    at every request (length penalty, a sampling seed) and that decode at least 60 tokens a line. -> the default
    requests' latencies in seconds."""
    latencies: list[float] = []
    errors: list[str | None] = []
    lock, done, stop = threading.Lock(), threading.Event(), threading.Event()
    sent = [0] * DEFAULT_CLIENTS
    odd = [engine.config(alpha=0.5, min_len=60), engine.config(alpha=1.5, min_len=60),
           engine.config(sampling=True, seed=7, min_len=60)]
    odd_sent = [0]

    def send_default(client: int) -> None:
        line = LINES[(client * REQUESTS + sent[client]) % len(LINES)]
        start = time.perf_counter()

        def finished(job) -> None:
            with lock:
                errors.append(job.error)
                latencies.append(time.perf_counter() - start)
                sent[client] += 1
                more = sent[client] < REQUESTS
                if len(latencies) == DEFAULT_CLIENTS * REQUESTS:
                    done.set()
            if more:
                send_default(client)

        engine.submit([line], engine.config(), finished)

    def send_odd(_job=None) -> None:
        if _job is not None:
            errors.append(_job.error)
        if stop.is_set():
            return
        odd_sent[0] += 1
        engine.submit(LINES[odd_sent[0] % 50 : odd_sent[0] % 50 + 8], odd[odd_sent[0] % len(odd)], send_odd)

    if odd_client:
        send_odd()
    for client in range(DEFAULT_CLIENTS):
        send_default(client)
    finished_in_time = done.wait(120)
    stop.set()
    assert finished_in_time, "the default requests were not all answered within 120 s"
    assert not any(errors), errors
    if odd_client:
        assert odd_sent[0] >= 2, "the odd client's requests were answered too (it sent more than one)"
    deadline = time.monotonic() + 60
    while engine.stats()["queued"] and time.monotonic() < deadline:  # the odd client's last request
        time.sleep(0.01)
    return latencies


class StepClock:
    """The clock of `Turns`: it moves only when a search decodes a step (by that step's seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def take_turns(searches: dict[str, tuple[int, float]], turns: int) -> list[str]:
    """Searches (name -> (requests each step serves, seconds each step takes)) in threads of their own, as the
    engine runs them, asking for a turn before every step until `turns` steps are decoded. They all ask before the
    first turn is given (a gate holds it meanwhile); a step's seconds pass on the clock while it holds the turn.
    -> the search of every step, in order."""
    clock = StepClock()
    shares = Turns(clock)
    order: list[str] = []
    shares.take("gate", 1)

    def search(name: str, requests: int, seconds: float) -> None:
        while True:
            shares.take(name, requests)
            if len(order) >= turns:
                shares.leave(name)
                return
            order.append(name)
            clock.now += seconds

    threads = [threading.Thread(target=search, args=(name, *spec), daemon=True) for name, spec in searches.items()]
    for t in threads:
        t.start()
    with shares.cond:
        assert shares.cond.wait_for(lambda: len(shares.asking) == len(searches), timeout=60)
    shares.leave("gate")
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return order


def test_a_search_with_settings_of_its_own_gets_its_requests_share_of_the_turns():
    """The default search serves 4 requests with each step; a search of settings of its own serves one request
    (8 lines: its steps take twice as long). Decoding time is shared by request: the default search gets 4 times the
    odd one's time, 8 of its steps to the odd one's 1, and never waits for more than one odd step."""
    step = 2 * QUANTUM_S  # each step is a turn of its own
    order = take_turns({"default": (4, step), "odd": (1, 2 * step)}, turns=180)
    assert order.count("odd") == 20 and order.count("default") == 160, order
    between = "".join("d" if who == "default" else "o" for who in order)
    assert "oo" not in between
    assert 4 * order.count("odd") * 2 * step == pytest.approx(order.count("default") * step)
    # alone, the default search decodes every step; beside three odd searches, its 4 of the 7 requests' share
    assert take_turns({"default": (4, step)}, turns=10) == ["default"] * 10
    order = take_turns({"default": (4, step), "a": (1, step), "b": (1, step), "c": (1, step)}, turns=140)
    # 7 requests, steps of one length: the default search's 4 requests get 4/7 of the steps, each odd one's 1/7
    assert [order.count(name) for name in ("default", "a", "b", "c")] == [80, 20, 20, 20], order


def test_a_client_with_settings_of_its_own_and_the_default_clients_are_all_answered(engine):
    """Default clients and a client that changes its settings at every request, at once on the real engine: every
    request of both is answered, and the engine's queue empties (fair turns: the test above)."""
    alone = run_phase(engine, odd_client=False)
    beside = run_phase(engine, odd_client=True)
    assert len(alone) == len(beside) == DEFAULT_CLIENTS * REQUESTS
    assert engine.stats()["queued"] == 0


def test_requests_of_more_settings_than_workers_arriving_at_once_are_all_answered(engine):
    """Requests of SEARCHES + 2 different settings arrive together at an idle engine (its lock held meanwhile):
    every search takes its first batch, whatever else waits, so none is passed over and all are answered."""
    from nmt_cli.serve.engine import SEARCHES

    answered, done = [], threading.Event()
    configs = [engine.config(alpha=0.1 * k) for k in range(SEARCHES + 2)]

    def finished(job) -> None:
        answered.append(job.error)
        if len(answered) == 2 * len(configs):
            done.set()

    with engine.cond:  # (reentrant: submit takes it too)
        for cfg in configs:
            engine.submit(LINES[:2], cfg, finished)
            engine.submit(LINES[2:3], cfg, finished)
    assert done.wait(60), f"{len(answered)} of {2 * len(configs)} requests answered within 60 s"
    assert answered == [None] * len(answered)
