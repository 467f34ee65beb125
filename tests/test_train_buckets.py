"""Compiled training's fixed shapes: few of them, and padding to them changes neither the loss nor the gradients."""

from __future__ import annotations

import functools

import pytest
import torch

from nmt_cli.config import PAD_ID
from nmt_cli.data.batching import bucket_shape, length_bucket
from nmt_cli.data.store import collate
from nmt_cli.errors import ConfigError
from nmt_cli.training import loop as loop_mod
from nmt_cli.training.distributed.process import Runtime
from nmt_cli.training.distributed.world import Launch
from nmt_cli.training.launch import train
from nmt_cli.training.loop import Trainer
from nmt_cli.training.loss import label_smoothed_cross_entropy
from nmt_cli.training.plan import plan_run
from test_train import SMALL, small_cfg

NO_DROPOUT = {**SMALL, "dropout": 0.0}


def _trainer(data_dir, out_dir, **kw) -> Trainer:
    cfg = small_cfg(data_dir, out_dir, model=dict(NO_DROPOUT), max_steps=10, **kw)
    return Trainer(plan_run(cfg), Runtime(Launch("cpu", 1, None, False, "fp32")))


def _loss_and_grads(module, batch):
    module.zero_grad(set_to_none=True)
    logits = module(batch.src, batch.tgt_in, batch.src_pad_mask)
    loss, nll, n = label_smoothed_cross_entropy(logits, batch.tgt_out, 0.1, PAD_ID)
    loss.backward()
    return float(loss.detach()), float(nll), int(n), {k: p.grad.clone() for k, p in module.named_parameters()}


def test_padding_to_a_bucket_shape_adds_nothing_to_loss_gradients_or_counts(toy_data_dir, tmp_path):
    trainer = _trainer(toy_data_dir, tmp_path / "run")
    pairs = [trainer.train_data[i] for i in range(5)]
    tight = collate(pairs)
    rows, length = tight.src.size(0) + 3, max(tight.src.size(1), tight.tgt_in.size(1)) + 6
    padded = collate(pairs, shape=(rows, length))
    assert tuple(padded.src.shape) == tuple(padded.tgt_out.shape) == (rows, length)
    assert (padded.n_tgt_tokens, padded.n_src_tokens) == (tight.n_tgt_tokens, tight.n_src_tokens)
    assert not padded.src_pad_mask.all(dim=1).any()  # an added row still has a key to attend to (no NaN)
    ref, got = _loss_and_grads(trainer.module, tight), _loss_and_grads(trainer.module, padded)
    assert got[0] == pytest.approx(ref[0], rel=1e-5) and got[1] == pytest.approx(ref[1], rel=1e-5)
    assert got[2] == ref[2] == tight.n_tgt_tokens
    assert max(float(g.abs().max()) for g in ref[3].values()) > 1e-3
    for name in ref[3]:
        torch.testing.assert_close(got[3][name], ref[3][name], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        collate(pairs, shape=(rows, 2))


def _shape_recorder(monkeypatch) -> tuple[list, dict]:
    """torch.compile in the training loop replaced by a wrapper that records the shapes the model is called with
    (and runs it eagerly): what a compiled model would have to compile code for."""
    shapes, options = [], {}

    def fake_compile(module, **kw):
        options.update(kw)

        def call(src, tgt, pad_mask):
            shapes.append((tuple(src.shape), tuple(tgt.shape), tuple(pad_mask.shape)))
            return module(src, tgt, pad_mask)

        call.train = module.train
        return call

    monkeypatch.setattr(loop_mod.torch, "compile", fake_compile)
    return shapes, options


def test_compiled_training_sees_few_shapes(sample_data_dir, tmp_path, monkeypatch):
    shapes, options = _shape_recorder(monkeypatch)
    cfg = small_cfg(sample_data_dir, tmp_path / "run", max_tokens=1024, max_steps=40, compile=True)
    result = train(cfg)
    assert result.step == 40 and len(shapes) == 40
    assert options == {"dynamic": False}
    distinct = set(shapes)
    for src, tgt, mask in distinct:  # one (rows, length) for source and target, a bucket length
        assert src == tgt == mask and src[1] == length_bucket(src[1]) and src[0] * src[1] <= 1024
    # every batch of the epoch has one of at most 12 shapes (lengths up to 128), and dynamo may compile them all
    trainer = _trainer(sample_data_dir, tmp_path / "run2", max_tokens=1024, compile=True)
    all_shapes = {trainer.reader.batch_shape(idx) for idx in trainer.reader.batches}
    assert {(s[0], s[1]) for s, _, _ in distinct} <= all_shapes
    assert 3 <= len(all_shapes) <= 12
    assert torch._dynamo.config.recompile_limit >= len(all_shapes)
    # the eager run's batches are untouched: padded to their own longest sentence
    eager = _trainer(sample_data_dir, tmp_path / "run3", max_tokens=1024)
    assert eager.reader.batch_shape is None
    batch = eager.reader.collate([eager.reader.batches[0]]).micro_batches[0]
    assert batch.src.size(1) == int(eager.train_data.src_lengths[eager.reader.batches[0]].max())


def test_bucket_shapes_are_what_collate_pads_to(sample_data_dir, tmp_path):
    trainer = _trainer(sample_data_dir, tmp_path / "run", max_tokens=1024, compile=True)
    for idx in trainer.reader.batches[:20]:
        (batch,) = trainer.reader.collate([idx]).micro_batches
        assert tuple(batch.src.shape) == tuple(batch.tgt_in.shape) == trainer.reader.batch_shape(idx)
        lengths = trainer.train_data.tgt_lengths[idx]
        assert batch.n_tgt_tokens == int(lengths.sum()) == int(batch.tgt_out.ne(PAD_ID).sum())
    assert bucket_shape([3], [5], 1024) == (128, 8)


def _three_updates(data_dir, out_dir, **kw) -> tuple[list[float], dict]:
    """The losses of 3 updates and the weights after them."""
    trainer = _trainer(data_dir, out_dir, **kw)
    losses = [trainer.update(trainer.reader.next_update()).loss_sum for _ in range(3)]
    return losses, {k: v.clone() for k, v in trainer.module.state_dict().items()}


def _assert_same_training(got: tuple[list[float], dict], want: tuple[list[float], dict]) -> None:
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    for name, weight in want[1].items():
        torch.testing.assert_close(got[1][name], weight, rtol=1e-4, atol=1e-5)


def test_three_compiled_updates_equal_three_eager_ones(toy_data_dir, tmp_path, monkeypatch):
    """torch.compile (aot_eager: dynamo's graphs and autograd's, without code generation) trains the bucket-shaped
    batches to the same weights as the eager model does (dropout 0, fp32)."""
    monkeypatch.setattr(loop_mod.torch, "compile", lambda module, **kw: module)
    eager = _three_updates(toy_data_dir, tmp_path / "eager", compile=True)
    monkeypatch.setattr(loop_mod.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    _assert_same_training(_three_updates(toy_data_dir, tmp_path / "compiled", compile=True), eager)


def test_dynamic_compile_is_one_graph_for_every_batch_shape(sample_data_dir, toy_data_dir, tmp_path, monkeypatch):
    """--compile-shapes dynamic: the eager batches (padded to their own longest sentences), torch.compile'd once with
    dynamic=True; dynamo (aot_eager: its graphs, no code generation) keeps one graph over 20 updates of different
    shapes, and 3 compiled updates train to the eager weights."""
    import torch._dynamo

    from nmt_cli.commands.train import CompileShapes
    from nmt_cli.training.config import COMPILE_SHAPES

    assert tuple(c.value for c in CompileShapes) == COMPILE_SHAPES
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    monkeypatch.setattr(loop_mod.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    trainer = _trainer(sample_data_dir, tmp_path / "run", max_tokens=1024, compile=True, compile_shapes="dynamic")
    assert trainer.reader.batch_shape is None
    shapes = set()
    for _ in range(20):
        update = trainer.reader.next_update()
        shapes |= {(tuple(b.src.shape), tuple(b.tgt_in.shape)) for b in update.micro_batches}
        trainer.update(update)
    assert len(shapes) >= 10
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    _assert_same_training(_three_updates(toy_data_dir, tmp_path / "compiled", compile=True, compile_shapes="dynamic"),
                          _three_updates(toy_data_dir, tmp_path / "eager"))
    with pytest.raises(ConfigError, match="compile-shapes"):
        small_cfg(toy_data_dir, tmp_path / "bad", compile=True, compile_shapes="static").validate()
