"""The CUDA paths: the loss, autocast bf16/fp16 training, the fp16 loss scaler, the decoder cache and beam search,
translation against the CPU, and the DDP code path with two processes on one GPU. Skipped without a CUDA GPU."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from conftest import toy_pairs
from helpers_train import cli_args, poison_loss, torchrun
from helpers_translate import make_checkpoint, tiny_config
from nmt_cli.checkpoints.format import load
from nmt_cli.decoding import SearchConfig, beam_search, decode_batches
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints
from nmt_cli.model import Transformer
from nmt_cli.training.launch import train
from nmt_cli.training.loss import label_smoothed_cross_entropy
from test_search import FullRecompute

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

@pytest.fixture()
def no_tf32():
    """Plain float32 matrix products (training turns TF32 on for the whole process)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


SMALL = {"d_model": 32, "d_ff": 64, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1}


def cuda_cfg(data_dir, out_dir, **kw):
    from nmt_cli.training.config import TrainConfig

    base = dict(preset="tiny", model=dict(SMALL), max_tokens=256, update_freq=1, warmup=10, lr=3e-3,
                precision="bf16", gpus=1, log_every=5)
    base.update(kw)
    return TrainConfig(str(data_dir), str(out_dir), **base)


def _reference_loss(logits, target, epsilon):
    lprobs = torch.log_softmax(logits.double(), dim=-1)
    keep = target.ne(0)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    loss = ((1 - epsilon) * nll + epsilon / logits.size(-1) * smooth)[keep].sum()
    return loss, nll[keep].sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_loss_and_gradient_on_cuda_match_a_float64_reference(dtype):
    torch.manual_seed(0)
    logits = (3 * torch.randn(300, 1000, device="cuda")).to(dtype)
    target = torch.randint(4, 1000, (300,), device="cuda")
    target[::7] = 0  # padding
    a = logits.clone().requires_grad_()
    loss, nll, n = label_smoothed_cross_entropy(a, target, 0.1, pad_id=0)
    b = logits.double().clone().requires_grad_()
    ref_loss, ref_nll = _reference_loss(b, target, 0.1)
    assert n == int(target.ne(0).sum())
    torch.testing.assert_close(loss.double(), ref_loss.detach(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(nll.double(), ref_nll.detach(), rtol=1e-5, atol=1e-3)
    (1000.0 * loss).backward()  # a loss scale: the backward multiplies the stored gradient
    (1000.0 * ref_loss).backward()
    assert a.grad.dtype == dtype and torch.isfinite(a.grad).all()
    tol = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    err = (a.grad.double() - b.grad).norm() / b.grad.norm()
    assert err < tol, f"relative gradient error {err:.2e}"
    assert a.grad[::7].abs().sum() == 0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_training_on_one_gpu(toy_data_dir, tmp_path, precision):
    run = tmp_path / "run"
    result = train(cuda_cfg(toy_data_dir, run, max_steps=40, precision=precision))
    first, last = result.history[0], result.history[-1]
    assert result.step == 40 and last["loss"] < 0.8 * first["loss"]
    config = json.loads((run / "config.json").read_text())
    assert (config["device"], config["precision"]) == ("cuda", precision)
    ckpt = load(run / "checkpoint_last.pt")
    assert all(t.device.type == "cpu" and torch.isfinite(t).all() for t in ckpt.model_state.values())
    if precision == "fp16":
        assert ckpt.train_state["scaler"]["scale"] > 0
    resumed = train(cuda_cfg(toy_data_dir, run, max_steps=50, precision=precision))  # resume on the GPU
    assert resumed.step == 50 and resumed.history[-1]["loss"] < first["loss"]


def test_fp16_scaler_skips_an_overflowed_update_on_cuda(toy_data_dir, tmp_path, monkeypatch):
    poison_loss(monkeypatch, at=3, factor=float("inf"))
    result = train(cuda_cfg(toy_data_dir, tmp_path / "run", max_steps=6, precision="fp16"))
    assert result.step == 6 and result.overflows == 1
    ckpt = load(tmp_path / "run" / "checkpoint_last.pt")
    assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())


def test_autocast_loss_is_close_to_fp32_on_the_same_batch(toy_data_dir):
    from nmt_cli.data.store import ParallelData, collate
    from nmt_cli.training.distributed.process import DTYPES

    data = ParallelData(toy_data_dir, "train")
    batch = collate([data[i] for i in range(32)]).to("cuda")
    torch.manual_seed(0)
    model = Transformer(tiny_config(64, dropout=0.0)).cuda()
    losses = {}
    for name in ("fp32", "bf16", "fp16"):
        with torch.autocast("cuda", dtype=DTYPES[name], enabled=name != "fp32"):
            logits = model(batch.src, batch.tgt_in, batch.src_pad_mask)
        losses[name] = float(label_smoothed_cross_entropy(logits, batch.tgt_out, 0.1)[0].detach())
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
    assert losses["fp16"] == pytest.approx(losses["fp32"], rel=5e-3)


def _tiny_model(seed=0, vocab_size=64, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(vocab_size, max_positions=128, **kw)).eval()


def _sources(device, n=12, seed=3):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 14, (n,), generator=g)
    src = torch.zeros(n, int(lengths.max()), dtype=torch.long)
    for i, length in enumerate(lengths.tolist()):
        src[i, : length - 1] = torch.randint(4, 64, (length - 1,), generator=g)
        src[i, length - 1] = 3  # EOS
    return src.to(device), src.eq(0).to(device)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
def test_cached_decoding_equals_uncached_on_cuda(beam, static, no_tf32):
    """The engine (exact and static cache layouts, batches joining) against re-running the decoder on every prefix."""
    model = _tiny_model().cuda()
    src, mask = _sources("cuda")
    cfg = SearchConfig(beam=beam, max_len_a=1.0, max_len_b=8)
    batches = [(src[:6], mask[:6]), (src[6:], mask[6:])]
    cached = sum(decode_batches(model, batches, cfg, join_below=1.0, static=static), [])
    uncached = sum(decode_batches(FullRecompute(model), batches, cfg, join_below=1.0), [])
    for a, b in zip(cached, uncached, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        for x, y in zip(a, b, strict=True):
            assert x.score == pytest.approx(y.score, abs=1e-4)


# attention as five operations (the default) or through SDPA (decoding.attention.SDPA_DECODING); the best candidates
# by a topk over each beam's vocabulary (the default) or by blocks of it (decoding.beam.BLOCK_DEVICES)
@pytest.mark.parametrize("variant", ["default", "sdpa", "blocks"])
@pytest.mark.parametrize("options", [dict(beam=4, nbest=2), dict(beam=1), dict(beam=4, stop="top", min_len=2)])
def test_cuda_graph_decoding_equals_eager_and_syncs_only_at_host_checks(options, variant, no_tf32, monkeypatch):
    """The steps replayed as CUDA graphs (decoding/graphs.py) give the eager static engine's hypotheses and
    scores, batches joining; every step between two host checks runs under set_sync_debug_mode("error") (any host
    sync raises); the graphs were recorded and replayed, and recording never failed."""
    from nmt_cli.decoding import attention as decoding_attention
    from nmt_cli.decoding import beam as decoding_beam
    from nmt_cli.decoding.graphs import StepGraphs

    monkeypatch.setattr(decoding_attention, "SDPA_DECODING", variant == "sdpa")
    monkeypatch.setattr(decoding_beam, "BLOCK_DEVICES", ("cpu", "cuda") if variant == "blocks" else ("cpu",))
    model = _tiny_model(vocab_size=256 if variant == "blocks" else 64).cuda()  # blocks: V >= 16 x 2K
    src, mask = _sources("cuda", n=24)
    cfg = SearchConfig(max_len_a=1.0, max_len_b=12, **options)
    batches = [(src[:12], mask[:12]), (src[12:], mask[12:])]
    eager = sum(decode_batches(model, batches, cfg, join_below=0.5, static=True, check_every=4), [])
    graphs = StepGraphs("cuda")
    graphs.check_syncs = True
    for _ in range(2):  # the second pass replays graphs recorded by the first where the addresses repeat
        graphed = sum(decode_batches(model, batches, cfg, join_below=0.5, static=True, check_every=4,
                                     graphs=graphs), [])
        for a, b in zip(eager, graphed, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            for x, y in zip(a, b, strict=True):
                assert x.score == pytest.approx(y.score, abs=1e-5)
    assert graphs.broken is None
    assert graphs.recorded >= 1 and graphs.replayed > 2 * graphs.recorded, (graphs.recorded, graphs.replayed)


def test_beam_search_on_cuda_equals_cpu_in_fp32(no_tf32):
    model = _tiny_model()
    src, mask = _sources("cpu")
    cfg = SearchConfig(beam=4, max_len_a=1.0, max_len_b=8, nbest=2)
    on_cpu = beam_search(model, src, mask, cfg)
    on_gpu = beam_search(model.cuda(), src.cuda(), mask.cuda(), cfg)
    for a, b in zip(on_cpu, on_gpu, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        for x, y in zip(a, b, strict=True):
            assert x.score == pytest.approx(y.score, abs=1e-4)


@pytest.mark.parametrize("graphs", [False, True, None])  # None: the default, graphs on a GPU
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_translate_on_cuda_agrees_with_cpu(tmp_path, toy_tokenizer_bytes, precision, graphs, no_tf32):
    """Same checkpoint, same search: fp32 on the GPU gives the CPU's output; bf16/fp16 nearly all of it; with and
    without CUDA graphs (--no-cuda-graphs), which are on by default."""
    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=1)
    lines = [p[0] for p in toy_pairs(60, seed=11)]
    config = TranslateConfig(search=SearchConfig(beam=4, max_len_a=1.0, max_len_b=6))
    cpu = Translator(load_checkpoints([path]), "cpu", "fp32", config).translate(lines)
    on_gpu = Translator(load_checkpoints([path]), "cuda", precision, dataclasses.replace(config, cuda_graphs=graphs))
    gpu = on_gpu.translate(lines)
    assert (on_gpu.graphs is not None and on_gpu.graphs.replayed > 0 and on_gpu.graphs.broken is None) == (
        graphs is not False)
    same = sum(a[0][1] == b[0][1] for a, b in zip(cpu, gpu, strict=True))
    assert same >= (len(lines) if precision == "fp32" else 0.8 * len(lines)), f"{same}/{len(lines)} identical"
    if precision == "fp32":
        for a, b in zip(cpu, gpu, strict=True):
            assert a[0][0] == pytest.approx(b[0][0], abs=1e-4)


@pytest.mark.parametrize("flags", [[], ["--no-cuda-graphs"]])
def test_translate_cli_on_cuda(tmp_path, toy_tokenizer_bytes, flags):
    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=1)
    text = "".join(p[0] + "\n" for p in toy_pairs(20, seed=5))
    r = subprocess.run([sys.executable, "-m", "nmt_cli.cli", "translate", "-m", str(path), "--device", "cuda",
                        "--precision", "fp16", "--max-len-b", "5", *flags], input=text, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 20


def _ddp_rank(rank: int, plan, init_method: str, queue) -> None:
    from nmt_cli.training.launch import run_process

    result = run_process(plan, rank, 0, init_method)  # local rank 0 for both: two processes share one GPU
    queue.put((rank, result.ranks_agree, result.step))


@pytest.mark.parametrize("backend", ["gloo"])
def test_ddp_two_processes_on_one_gpu_train_and_agree(toy_data_dir, tmp_path, backend):
    """The DDP code path on CUDA (gradient sync, agreed flags, rank-0 checkpoints) with 2 processes on one GPU
    (NCCL refuses two ranks on one device; gloo carries the CUDA tensors)."""
    import torch.multiprocessing as mp

    from nmt_cli.training.distributed.spawn import free_port
    from nmt_cli.training.distributed.world import Launch
    from nmt_cli.training.plan import plan_run, write_run_config

    plan = plan_run(cuda_cfg(toy_data_dir, tmp_path / "run", max_steps=8, save_every=4))
    plan = dataclasses.replace(plan, launch=Launch("cuda", 2, backend, False, "bf16"),
                               batching=dataclasses.replace(plan.batching, world_size=2))
    write_run_config(plan)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_ddp_rank, args=(r, plan, init, queue)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    results = sorted(queue.get(timeout=5) for _ in range(2))
    assert results == [(0, True, 8), (1, True, 8)]
    ckpt = load(tmp_path / "run" / "checkpoint_last.pt")
    assert ckpt.train_state["world_size"] == 2 and ckpt.train_state["step"] == 8


def test_torchrun_one_gpu_compiled_trains_validates_and_scores(toy_data_dir, tmp_path):
    """`torchrun --nproc-per-node 1 nmt train --compile --valid-bleu` on one GPU: torchrun's environment, the compiled
    model, validation with BLEU and the checkpoints, end to end."""
    run = tmp_path / "run"
    args = map(str, cli_args(toy_data_dir, run, "--precision", "bf16", "--compile", "--max-steps", "30",
                             "--save-every", "15", "--valid-bleu", "--log-every", "5"))
    proc = subprocess.run([*torchrun(1), "-m", "nmt_cli.cli", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((run / "config.json").read_text())
    assert (config["device"], config["precision"]) == ("cuda", "bf16")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in rows if r["kind"] == "valid"]
    assert valid and all("valid_bleu" in r and r["valid_loss"] == r["valid_loss"] for r in valid), valid
    assert load(run / "checkpoint_last.pt").train_state["step"] == 30


# ---- --max-tokens auto under a memory cap (nmt_cli/runtime/memory.py) ---------------------------------------------------


class memory_budget:
    """Cap this process's CUDA allocations at what is allocated now plus `budget` bytes
    (torch.cuda.set_per_process_memory_fraction); the cap is lifted (fraction 1.0) on exit."""

    def __init__(self, budget: int):
        self.budget = budget

    def __enter__(self):
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_allocated() + self.budget) / total))
        return self

    def __exit__(self, *exc):
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


MIB = 2**20


def test_training_probe_shrinks_with_the_memory_cap_and_its_answer_trains():
    from nmt_cli.training.distributed.process import DTYPES
    from nmt_cli.training.probe import largest_train_batch, train_fits

    torch.manual_seed(0)
    model = Transformer(tiny_config(8000, d_model=256, d_ff=1024, n_heads=4, max_positions=128)).cuda()
    optimizer = torch.optim.Adam(model.parameters())

    def bf16():
        return torch.autocast("cuda", dtype=DTYPES["bf16"])

    found = {}
    for budget in (768 * MIB, 3072 * MIB):
        with memory_budget(budget):
            found[budget] = largest_train_batch(model, optimizer, bf16, longest=64, cap=10**6)
            # what the probe answered trains under the same cap (fresh Adam moments counted)
            assert found[budget] is not None and train_fits(model, optimizer, bf16, 64, 0.1)(found[budget])
    small, large = found[768 * MIB], found[3072 * MIB]
    assert 64 <= small < 0.7 * large, found
    assert all(p.grad is None for p in model.parameters()) and not optimizer.state


def test_translation_probe_shrinks_with_the_memory_cap_and_its_answer_translates(tmp_path, toy_tokenizer_bytes):
    from nmt_cli.inference.translate import PROBE_CAP

    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=1, d_model=64, d_ff=128, max_positions=160)
    lines = [" ".join(p[0] for p in toy_pairs(8, seed=i)) for i in range(300)]  # long lines: ~40 words
    config = TranslateConfig(search=SearchConfig(beam=4), max_tokens="auto")
    found = {}
    for budget in (1024 * MIB, 4096 * MIB):
        with memory_budget(budget):
            translator = Translator(load_checkpoints([path]), "cuda", "fp32", config)
            found[budget] = translator.config.max_tokens
            assert "probed" in translator.max_tokens_reason
            out = translator.translate(lines)  # no out-of-memory error with the probed batches
            assert len(out) == len(lines)
            del translator
    small, large = found[1024 * MIB], found[4096 * MIB]
    assert small < large or (small < PROBE_CAP and large == PROBE_CAP), found


def test_train_with_max_tokens_auto_under_a_cap_records_what_it_used(toy_data_dir, tmp_path):
    events = []
    with memory_budget(512 * MIB):
        result = train(cuda_cfg(toy_data_dir, tmp_path / "run", max_tokens="auto", update_tokens=4096, max_steps=4,
                                model=dict(SMALL, d_model=64, d_ff=128)), progress=events.append)
    assert result.step == 4
    start = next(e for e in events if e["kind"] == "start")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "fit" in start["max_tokens_auto"] and config["max_tokens"] == start["max_tokens"] <= 4096
    assert config["options"]["max_tokens"] == "auto"
    ckpt = load(tmp_path / "run" / "checkpoint_last.pt")
    assert ckpt.train_state["probed_max_tokens"] >= start["max_tokens"]


def test_cuda_out_of_memory_in_translation_is_one_line(tmp_path, toy_tokenizer_bytes):
    """A real CUDA out-of-memory error (a cap far below one batch) ends nmt translate with one line."""
    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=1)
    text = "".join(p[0] + "\n" for p in toy_pairs(2000, seed=5))  # short lines: no truncation warning
    script = ("import torch, sys; from nmt_cli.cli import main; torch.cuda.init(); "
              "torch.cuda.set_per_process_memory_fraction(16 * 2**20 / torch.cuda.get_device_properties(0).total_memory);"
              " main(sys.argv[1:])")
    r = subprocess.run([sys.executable, "-c", script, "translate", "-m", str(path), "--device", "cuda",
                        "--max-tokens", "200000"], input=text, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "memory" in r.stderr and "--max-tokens" in r.stderr, r.stderr


@pytest.mark.parametrize("options", [dict(seed=7), dict(topk=5)])
def test_serve_engine_samples_on_cuda_with_a_request_seed_or_settings(tmp_path, toy_tokenizer_bytes, options):
    """A `nmt serve` request with its own seed or sampling settings gets a generator on the model's device (before,
    a CPU one, which torch.multinomial refuses on CUDA: the request failed); with a seed, twice the same output."""
    import threading

    from nmt_cli.serve.engine import Engine

    path = make_checkpoint(tmp_path / "m.pt", toy_tokenizer_bytes, seed=1)
    engine = Engine(Translator.load(str(path), device="cuda", sampling=True, max_len_b=6), max_queue=16)

    def run(lines):
        done, box = threading.Event(), []
        engine.submit(lines, engine.config(**options), lambda job: (box.append(job), done.set()))
        assert done.wait(120)
        return box[0]

    try:
        lines = [p[0] for p in toy_pairs(6, seed=2)]
        first, second = run(lines), run(lines)
        assert first.error is None and second.error is None, first.error or second.error
        if "seed" in options:
            assert [h[0].tokens for h in first.results] == [h[0].tokens for h in second.results]
    finally:
        engine.close()


@pytest.mark.parametrize("ensemble", [False, True])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("options", [dict(beam=4, nbest=2), dict(beam=1), dict(sampling=True, seed=3, nbest=2),
                                     dict(beam=4, no_repeat_ngram=2, min_len=2)])
def test_every_eager_path_waits_for_the_gpu_only_at_host_checks(options, static, ensemble, monkeypatch):
    """Without CUDA graphs too (serve, ensembles, sampling, --no-cuda-graphs, validation): every step between two
    host checks (one every GPU_CHECK_EVERY steps, the default on a GPU) runs under set_sync_debug_mode("error"),
    batches joining, prefixes given; and the outputs are those of checking every step (but for sampling)."""
    from nmt_cli.decoding import scheduler
    from nmt_cli.decoding.batch import Sources
    from nmt_cli.inference.ensemble import Ensemble

    model = Ensemble([_tiny_model(1).cuda(), _tiny_model(2).cuda()]) if ensemble else _tiny_model().cuda()
    src, mask = _sources("cuda", n=24)
    lengths = (~mask).sum(1).tolist()
    batches = [Sources(src[:12], mask[:12], lengths[:12]), Sources(src[12:], mask[12:], lengths[12:])]
    prefixes = [[[5, 6]] + [[]] * 11, None]
    cfg = SearchConfig(max_len_a=1.0, max_len_b=12, **options)
    every = decode_batches(model, batches, cfg, prefixes, static=static, check_every=1)
    monkeypatch.setattr(scheduler, "CHECK_SYNCS", True)
    try:
        sparse = decode_batches(model, batches, cfg, prefixes, static=static)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert [len(hs) for hs in sum(sparse, [])] == [len(hs) for hs in sum(every, [])]
    if not cfg.sampling:
        assert [[h.tokens for h in hs] for hs in sum(sparse, [])] == [[h.tokens for h in hs] for hs in sum(every, [])]
