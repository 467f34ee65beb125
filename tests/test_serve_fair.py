"""The serve engine shares its decoding fairly between requests with different search settings: a client that keeps
sending requests with settings of its own (length penalties, seeds, a long minimum length) does not hold back the
clients that send the server's default settings. Latencies are compared within the test, against the same engine
with no such client, never against a fixed time."""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from conftest import toy_pairs
from helpers_translate import make_checkpoint
from nmt_cli.inference.translate import Translator
from nmt_cli.serve.engine import Engine

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


def test_a_client_with_settings_of_its_own_does_not_hold_the_default_requests_back(engine):
    """Phases without and with the odd client alternate (twice each, the machine's speed drifts); the default
    requests' median latency beside the odd client stays within 2x of the median without it."""
    run_phase(engine, odd_client=False)  # warm-up
    alone, beside = [], []
    for _ in range(2):
        alone += run_phase(engine, odd_client=False)
        beside += run_phase(engine, odd_client=True)
    ratio = statistics.median(beside) / statistics.median(alone)
    assert ratio <= 2.0, (f"default requests' median latency {1000 * statistics.median(beside):.1f} ms beside "
                          f"the odd client against {1000 * statistics.median(alone):.1f} ms without it ({ratio:.2f}x)")
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
