"""--max-tokens auto and out-of-memory errors, on CPU: the probe's search given a predicate, the training probe
against a model that runs out of memory past a size, auto = today's default on CPU (API and command line), the
option's errors, and an out-of-memory error as one line naming the option to lower. The probe on a real GPU under
a memory cap: tests/test_cuda.py."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

from helpers_translate import make_checkpoint, tiny_config
from nmt_cli.checkpoints.format import load
from nmt_cli.cli import main
from nmt_cli.decoding import SearchConfig
from nmt_cli.errors import ConfigError
from nmt_cli.inference.probe import translate_fits, translate_shapes
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints
from nmt_cli.model import Transformer
from nmt_cli.runtime import memory
from nmt_cli.runtime.defaults import MAX_TOKENS_PER_DEVICE
from nmt_cli.runtime.memory import (
    SAFETY,
    OutOfMemory,
    is_out_of_memory,
    largest_fitting,
    out_of_memory_advice,
)
from nmt_cli.training.config import BatchPlan, TrainConfig, probed_batching, resolve_batching
from nmt_cli.training.probe import largest_train_batch, train_fits


def fp32():
    return torch.autocast("cpu", enabled=False)


def _cuda_oom() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")


# ---- the search -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [64, 100, 1000, 4096, 5000, 10_000, 77_777, 200_000])
@pytest.mark.parametrize("start", [1024, 4096, 100_000])  # (callers start at 4096 or 8192)
def test_search_finds_the_limit_within_its_resolution_in_few_probes(limit, start):
    tried = []

    def fits(n):
        tried.append(n)
        return n <= limit

    found = largest_fitting(fits, start=start, cap=300_000, floor=64)
    assert len(tried) <= memory.MAX_PROBES
    assert found is not None and found <= limit, (found, tried)
    if 1 / 256 <= limit / start <= 256:  # (within 2^8 of the limit, the doubling or halving reaches it)
        assert found >= limit / 2, (found, tried)
    if 1 / 32 <= limit / start <= 32:  # (the probes start within a factor 32 of the limit: bisection finishes)
        assert found >= limit - max(64, memory.RESOLUTION * limit), (found, tried)


def test_search_stops_at_the_cap_and_at_the_floor():
    assert largest_fitting(lambda n: True, start=4096, cap=20_000) == 20_000
    assert largest_fitting(lambda n: False, start=4096, cap=20_000, floor=100) is None
    tried = []
    assert largest_fitting(lambda n: tried.append(n) or n <= 150, start=4096, cap=20_000, floor=100) in range(100, 151)
    assert min(tried) >= 100


# ---- the training probe on CPU, with a model that runs out of memory past a size -------------------------------


class RunsOutPast(torch.nn.Module):
    """A Transformer that raises CUDA's out-of-memory error for batches of more than `limit` tokens."""

    def __init__(self, limit: int):
        super().__init__()
        self.inner = Transformer(tiny_config(50))
        self.config, self.limit, self.seen = self.inner.config, limit, []

    def forward(self, src, tgt, pad):
        self.seen.append(src.numel())
        if src.numel() > self.limit:
            _cuda_oom()
        return self.inner(src, tgt, pad)


def test_training_probe_keeps_a_safe_share_of_what_fits_and_leaves_no_trace():
    model = RunsOutPast(limit=3000)
    optimizer = torch.optim.Adam(model.parameters())
    rng = torch.get_rng_state()
    found = largest_train_batch(model, optimizer, fp32, longest=20, cap=100_000)
    assert int(SAFETY * 3000 * (1 - memory.RESOLUTION)) - 20 <= found <= int(SAFETY * 3000)
    assert max(model.seen) > 3000 and len(model.seen) <= memory.MAX_PROBES  # it did run out, and not too often
    assert all(p.grad is None for p in model.parameters()) and not optimizer.state
    assert torch.equal(torch.get_rng_state(), rng)  # dropout streams untouched: a run is the same with or without


def test_training_probe_runs_the_real_loss_backward_on_cpu():
    model = Transformer(tiny_config(50))
    fits = train_fits(model, torch.optim.Adam(model.parameters()), fp32,
                      length=12, label_smoothing=0.1)
    assert fits(240) and all(p.grad is None for p in model.parameters())


def test_training_probe_is_capped_by_the_update_share():
    found = largest_train_batch(RunsOutPast(10**9), torch.optim.Adam([torch.zeros(1, requires_grad=True)]),
                                fp32, longest=10, cap=2048)
    assert found == 2048


# ---- training: batch plans ------------------------------------------------------------------------------------


def test_auto_on_cpu_is_the_default_and_on_cuda_a_provisional_estimate():
    from nmt_cli.config import preset

    auto, default = TrainConfig("d", "o", preset="base", max_tokens="auto"), TrainConfig("d", "o", preset="base")
    assert resolve_batching(auto, 1, "cpu") == resolve_batching(default, 1, "cpu")
    assert not resolve_batching(auto, 1, "cpu").probe
    on_gpu = resolve_batching(auto, 1, "cuda", preset("big"), int(16e9))
    assert on_gpu.probe and on_gpu.max_tokens == resolve_batching(default, 1, "cuda", preset("big"), int(16e9)).max_tokens


@pytest.mark.parametrize("fits, update_freq, expected", [
    (14000, "auto", (12500, 2)),  # the update split into equal micro-batches that fit
    (30000, "auto", (25000, 1)),
    (8000, "auto", (6250, 4)),
    (8000, 3, (8000, 3)),  # a fixed --update-freq keeps micro-batches of what fits
])
def test_probed_batching_keeps_the_update_size(fits, update_freq, expected):
    cfg = TrainConfig("d", "o", preset="base", max_tokens="auto", update_freq=update_freq)
    plan = probed_batching(cfg, BatchPlan(25000, 1 if update_freq == "auto" else update_freq, 1, 25000, True), fits)
    assert (plan.max_tokens, plan.update_freq) == expected and not plan.probe


def test_train_config_takes_auto_or_a_positive_integer():
    assert TrainConfig("d", "o", max_tokens="auto").validate().max_tokens == "auto"
    assert TrainConfig("d", "o", max_tokens="512").validate().max_tokens == 512
    for bad in ("lots", 0, -3):
        with pytest.raises(ConfigError, match="--max-tokens"):
            TrainConfig("d", "o", max_tokens=bad).validate()


# ---- translation ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("memory") / "m.pt", toy_tokenizer_bytes, seed=1)


def test_translate_auto_on_cpu_is_the_default(ckpt_path):
    tr = Translator(load_checkpoints([ckpt_path]), "cpu", "fp32", TranslateConfig(max_tokens="auto"))
    assert tr.config.max_tokens == MAX_TOKENS_PER_DEVICE["cpu"] and "CPU default" in tr.max_tokens_reason
    assert Translator(load_checkpoints([ckpt_path]), "cpu").max_tokens_reason is None
    assert TranslateConfig(max_tokens="300").validate().max_tokens == 300
    with pytest.raises(ConfigError, match="positive integer or 'auto'"):
        TranslateConfig(max_tokens="lots").validate()


def test_translate_shapes_are_the_longest_and_the_most_sentences():
    assert translate_shapes(65536, 256, 512) == [(256, 256), (512, 128)]
    assert translate_shapes(4096, 256, 512) == [(16, 256), (512, 8)]
    assert translate_shapes(100_000, 100, 512) == [(512, 100)]  # many sentences are the longest ones too
    assert translate_shapes(300, 256, 512) == [(1, 256), (300, 1)]  # never more tokens than asked


def test_translation_probe_decodes_every_output_to_its_maximum_length():
    model = Transformer(tiny_config(50)).eval()
    steps = []
    real_step = model.step
    model.step = lambda tokens, cache: steps.append(tokens.size(0)) or real_step(tokens, cache)
    search = SearchConfig(beam=2, max_len_a=1.0, max_len_b=5)
    assert translate_fits(model, search, max_source=8, max_sentences=4, device=torch.device("cpu"))(32)
    # (4 sentences of 8 tokens: 8 + 5 steps, rows = sentences x beam after the first), then 4 of 8 again: one shape
    assert len(steps) == 13 and steps[1:] == [8] * 12
    layouts = []  # with CUDA graphs on, the probe decodes in their (static) cache layout
    real_init = model.init_cache
    model.init_cache = lambda memory, pad=None, static=False: layouts.append(static) or real_init(memory, pad, static)
    assert translate_fits(model, search, 8, 4, torch.device("cpu"), static=True)(32) and layouts == [True]


# ---- the command line -------------------------------------------------------------------------------------------


def _main(argv: list[str], monkeypatch, capsys, stdin: bytes = b"") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("command", ["translate -m m.pt", "serve -m m.pt", "train data -o run"])
@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_bad_max_tokens_is_one_usage_line(command, value, monkeypatch, capsys):
    status, out, err = _main([*command.split(), "--max-tokens", value], monkeypatch, capsys)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "--max-tokens" in err and "positive integer or 'auto'" in err, err


def test_translate_cli_auto_on_cpu_says_so_and_translates_as_the_default(ckpt_path, monkeypatch, capsys):
    text = b"the cat\nthe dog runs\n"
    status, default, _ = _main(["translate", "-m", str(ckpt_path), "--device", "cpu"], monkeypatch, capsys, text)
    assert status == 0
    status, auto, err = _main(["translate", "-m", str(ckpt_path), "--device", "cpu", "--max-tokens", "auto"],
                              monkeypatch, capsys, text)
    assert status == 0 and auto == default
    assert f"--max-tokens auto: {MAX_TOKENS_PER_DEVICE['cpu']}, the CPU default" in err


def test_train_cli_auto_on_cpu_says_so_and_records_the_default(toy_data_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    status, _, err = _main(["train", str(toy_data_dir), "-o", str(run), "--preset", "tiny", "--d-model", "32",
                            "--d-ff", "64", "--layers", "1", "--max-tokens", "auto", "--max-steps", "2", "--gpus",
                            "0", "--precision", "fp32"], monkeypatch, capsys)
    assert status == 0, err
    assert "--max-tokens auto: the default micro-batch" in err
    config = json.loads((run / "config.json").read_text())
    from nmt_cli.training.plan import plan_run

    default = plan_run(TrainConfig(str(toy_data_dir), str(tmp_path / "other"), preset="tiny", gpus=0, precision="fp32",
                                   model={"d_model": 32, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1}))
    assert config["options"]["max_tokens"] == "auto" and config["max_tokens"] == default.batching.max_tokens
    assert config["update_freq"] == default.batching.update_freq


# ---- out of memory ----------------------------------------------------------------------------------------------


def test_out_of_memory_errors_become_one_line_naming_the_option():
    with pytest.raises(OutOfMemory, match="lower --max-tokens") as caught:
        with out_of_memory_advice(lambda: "lower --max-tokens"):
            _cuda_oom()
    assert isinstance(caught.value.__cause__, torch.cuda.OutOfMemoryError)
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"))
    assert is_out_of_memory(MemoryError())
    wrapped = RuntimeError("compiled code failed")  # as torch.compile reports an error inside compiled code
    wrapped.__cause__ = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 188.00 MiB.")
    assert is_out_of_memory(wrapped) and not is_out_of_memory(caught.value)  # (the one line, not taken again)
    for other in (RuntimeError("shape mismatch"), ValueError("x")):
        with pytest.raises(type(other)):
            with out_of_memory_advice(lambda: "never"):
                raise other


def test_translate_out_of_memory_is_one_line(ckpt_path, monkeypatch, capsys):
    from nmt_cli.inference import translate as core

    monkeypatch.setattr(core, "decode_streams", lambda *a, **kw: _cuda_oom())
    status, out, err = _main(["translate", "-m", str(ckpt_path), "--beam", "5", "--max-tokens", "700", "--threads", "1"], monkeypatch,
                             capsys, b"the cat\n")
    assert status == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "out of" in err and "memory" in err and "--max-tokens" in err and "--beam" in err and "700" in err, err


def test_train_out_of_memory_is_one_line_and_keeps_the_last_checkpoint(toy_data_dir, tmp_path, monkeypatch, capsys):
    from nmt_cli.training import loop as loop_mod

    real, calls = loop_mod.label_smoothed_cross_entropy, {"n": 0}

    def runs_out(logits, target, epsilon, pad_id):
        calls["n"] += torch.is_grad_enabled()
        if calls["n"] == 5:
            _cuda_oom()
        return real(logits, target, epsilon, pad_id)

    monkeypatch.setattr(loop_mod, "label_smoothed_cross_entropy", runs_out)
    run = tmp_path / "run"
    status, _, err = _main(["train", str(toy_data_dir), "-o", str(run), "--preset", "tiny", "--d-model", "32",
                            "--d-ff", "64", "--layers", "1", "--max-tokens", "256", "--update-freq", "1",
                            "--save-every", "2", "--max-steps", "10", "--gpus", "0", "--precision", "fp32"],
                           monkeypatch, capsys)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert status == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "at update 5" in errors[0] and "--max-tokens" in errors[0] and "--update-freq" in errors[0], errors
    assert load(run / "checkpoint_last.pt").train_state["step"] == 4  # the last good save, whole
