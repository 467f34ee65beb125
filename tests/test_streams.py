"""Several decoding streams on threads of their own (decoding/streams.py; `nmt translate --workers`)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from nmt_cli.decoding import SearchConfig, streams
from nmt_cli.errors import ConfigError
from nmt_cli.inference.translate import TranslateConfig, length_batches, stream_batches
from test_translate import ckpt_path, lines, translator  # noqa: F401 (ckpt_path: a fixture)


@pytest.fixture()
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def seen(monkeypatch) -> list[tuple[str, int]]:
    """(thread name, torch threads there) of every decode_batches call made by decode_streams."""
    calls: list[tuple[str, int]] = []
    real = streams.decode_batches

    def spy(*args, **kwargs):
        calls.append((threading.current_thread().name, torch.get_num_threads()))
        return real(*args, **kwargs)

    monkeypatch.setattr(streams, "decode_batches", spy)
    return calls


def test_streams_translate_as_one_stream_on_threads_of_their_own(ckpt_path, seen, torch_threads):  # noqa: F811
    torch.set_num_threads(2)
    inputs = lines(60, seed=3)
    prefixes = ["" if i % 3 else inputs[i].split()[0] for i in range(len(inputs))]  # aligned with their batches
    search = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=6)
    one = translator(ckpt_path, search=search, nbest=2, max_tokens=60, workers=1).translate(inputs, prefixes=prefixes)
    assert [name for name, _ in seen] == [threading.current_thread().name]
    seen.clear()
    for workers in (2, 3):
        several = translator(ckpt_path, search=search, nbest=2, max_tokens=60, workers=workers).translate(
            inputs, prefixes=prefixes)
        assert [[t.text for t in ts] for ts in several] == [[t.text for t in ts] for ts in one]
        assert [t.score for ts in several for t in ts] == pytest.approx([t.score for ts in one for t in ts], abs=1e-4)
        assert sorted(name for name, _ in seen) == [f"nmt-decode-{k}" for k in range(workers)]
        assert {n for _, n in seen} == {max(1, 2 // workers)}  # the cores shared out
        assert torch.get_num_threads() == 2  # and given back
        seen.clear()
    assert all(ts[0].text.startswith(p) for ts, p in zip(one, prefixes, strict=True))


def test_streams_get_equal_work_of_every_length():
    """Sentences are dealt to the streams by length before batching: each stream's source tokens are within one
    sentence of the others', where dealing out whole batches left one stream a batch more (the last, short one)."""
    gen = torch.Generator().manual_seed(0)
    sources = [[5] * int(n) for n in torch.randint(0, 40, (500,), generator=gen)]  # some empty
    for n_streams, max_tokens, max_sentences in ((2, 400, 1000), (3, 300, 1000), (2, 2000, 16)):
        batches, owner = stream_batches(sources, max_tokens, max_sentences, n_streams)
        assert sorted(i for b in batches for i in b) == [i for i, s in enumerate(sources) if s]  # each once
        assert all(len(b) * max(len(sources[i]) for i in b) <= max_tokens and len(b) <= max_sentences
                   for b in batches)
        work = [sum(len(sources[i]) for b, o in zip(batches, owner, strict=True) if o == k for i in b)
                for k in range(n_streams)]
        assert max(work) - min(work) <= 39, work
        for k in range(n_streams):  # each stream's batches longest first
            widths = [max(len(sources[i]) for i in b) for b, o in zip(batches, owner, strict=True) if o == k]
            assert widths == sorted(widths, reverse=True)
        dealt_batches = list(length_batches(sources, max_tokens, max_sentences))  # the old way, for contrast
        old = [sum(len(sources[i]) for b in dealt_batches[k::n_streams] for i in b) for k in range(n_streams)]
        assert max(old) - min(old) > max(work) - min(work)
    assert stream_batches(sources, 400, 1000, 1) == (list(length_batches(sources, 400, 1000)),
                                                      [0] * len(list(length_batches(sources, 400, 1000))))


def test_a_failing_stream_fails_the_call_and_threads_are_restored(ckpt_path, monkeypatch, torch_threads):  # noqa: F811
    torch.set_num_threads(2)
    real = streams.decode_batches

    def failing(model, batches, *args, **kwargs):
        if threading.current_thread().name == "nmt-decode-1":
            raise RuntimeError("stream 1 broke")
        return real(model, batches, *args, **kwargs)

    monkeypatch.setattr(streams, "decode_batches", failing)
    with pytest.raises(RuntimeError, match="stream 1 broke"):
        translator(ckpt_path, max_tokens=60, workers=2).translate(lines(40))
    assert torch.get_num_threads() == 2


def test_streams_by_default_and_when_asked(ckpt_path, torch_threads):  # noqa: F811
    torch.set_num_threads(2)
    assert translator(ckpt_path).streams() == 2  # a small model on two threads: two streams
    assert translator(ckpt_path, workers=3).streams() == 3
    assert translator(ckpt_path, workers=1).streams() == 1
    sampling = SearchConfig(beam=1, sampling=True, seed=1, max_len_a=1.0, max_len_b=4)
    assert translator(ckpt_path, search=sampling, workers=2).streams() == 1  # one generator: one stream
    assert translator(ckpt_path, search=sampling).streams() == 1
    torch.set_num_threads(1)
    assert translator(ckpt_path).streams() == 1
    torch.set_num_threads(2)
    big = translator(ckpt_path)
    big.model_parameters = [streams.TWO_STREAMS_BELOW]  # a model that large: one stream unless asked
    assert big.streams() == 1
    big.config = TranslateConfig(workers=2)
    assert big.streams() == 2
    with pytest.raises(ConfigError, match="workers must be at least 1"):
        TranslateConfig(workers=0).validate()


def test_default_streams_by_threads_and_model_size():
    assert streams.default_streams(2, streams.TWO_STREAMS_BELOW - 1) == 2
    assert streams.default_streams(8, streams.TWO_STREAMS_BELOW) == 1
    assert streams.default_streams(1, 1000) == 1


def test_seeded_sampling_is_the_same_whatever_the_workers(ckpt_path, torch_threads):  # noqa: F811
    torch.set_num_threads(2)
    sampling = SearchConfig(beam=1, nbest=2, sampling=True, seed=5, max_len_a=1.0, max_len_b=6)
    out = [[t.text for ts in translator(ckpt_path, search=sampling, nbest=2, max_tokens=60, workers=w).translate(
        lines(40)) for t in ts] for w in (1, 2)]
    assert out[0] == out[1]


def test_cli_workers_option(ckpt_path):  # noqa: F811
    text = "".join(line + "\n" for line in lines(12)).encode()
    outs = []
    for workers in ("1", "2"):
        proc = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(ckpt_path), "--beam", "2",
                               "--max-len-b", "4", "--max-tokens", "30", "--threads", "2", "--workers", workers],
                              input=text, capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()
        outs.append(proc.stdout.decode().splitlines())
    assert outs[0] == outs[1] and len(outs[0]) == 12
    proc = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(ckpt_path), "--workers", "0"],
                          input=text, capture_output=True)
    assert proc.returncode != 0 and b"--workers" in proc.stderr


def test_ctrl_c_ends_every_stream_before_it_propagates(ckpt_path, monkeypatch, torch_threads):  # noqa: F811
    import os
    import signal
    import time

    from nmt_cli.decoding.scheduler import Stopped

    torch.set_num_threads(2)
    running = threading.Barrier(3)

    def endless(model, batches, *args, stop, **kwargs):  # a stream that decodes until asked to stop (or 20 s)
        running.wait()
        end = time.monotonic() + 20
        while not stop() and time.monotonic() < end:
            time.sleep(0.01)
        if threading.current_thread().name == "nmt-decode-0":
            time.sleep(0.5)  # one stream ends later: the caller must still wait for it
        raise Stopped

    monkeypatch.setattr(streams, "decode_batches", endless)
    def ctrl_c():  # to the process, as a terminal sends it (Linux hands it to the main thread), once that waits
        running.wait()
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    # Python raises KeyboardInterrupt on SIGINT only where it started with SIGINT's default action: a process started
    # in the background by a shell without job control (a CI script's `cmd &`) inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            translator(ckpt_path, max_tokens=60, workers=2).translate(lines(40))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not [t for t in threading.enumerate() if t.name.startswith("nmt-decode")]  # none left to outlive it
    assert torch.get_num_threads() == 2


def test_decode_batches_stops_at_a_host_check_when_asked(ckpt_path):  # noqa: F811
    from nmt_cli.decoding import decode_batches
    from nmt_cli.decoding.batch import source_batch
    from nmt_cli.decoding.scheduler import Stopped

    tr = translator(ckpt_path)
    batch = source_batch(tr.encode(lines(4), 1), tr.device)
    asked = []
    with pytest.raises(Stopped):
        decode_batches(tr.model, [batch], tr.config.search, stop=lambda: asked.append(1) or len(asked) > 2)
    assert len(asked) == 3
