"""Validation sharded over ranks (training/validate.py): 2 gloo ranks give the figures of 1, and the hypotheses are
nmt translate's."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import sacrebleu

from conftest import write_toy_data_dir
from helpers_train import run_ranks, validate_checkpoint
from nmt_cli.data.store import ParallelData, read_tokenizer
from nmt_cli.training.config import TrainConfig
from nmt_cli.training.launch import train
from nmt_cli.training.validate import deal

BEAM = 2
SMALL = {"d_model": 64, "d_ff": 128, "n_heads": 4, "encoder_layers": 1, "decoder_layers": 1}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_tokenizer_bytes):
    """(checkpoint, data dir): a tiny model trained for 200 updates (~4 s) on the toy corpus, 300 valid sentences (two
    decoding batches on one rank, the second joining the first's search)."""
    root = tmp_path_factory.mktemp("validate")
    data = write_toy_data_dir(root / "data", toy_tokenizer_bytes, n_valid=300)
    cfg = TrainConfig(str(data), str(root / "run"), preset="tiny", model=dict(SMALL), max_tokens=512, update_freq=1,
                      warmup=30, lr=5e-3, precision="fp32", threads=1, max_steps=200, average=False)
    return train(cfg).last, data


def _validate(world_size: int, checkpoint, data, precision: str = "fp32") -> list[tuple]:
    """(rank, figures, hypotheses) of each rank, in rank order: one rank in this process, more over gloo."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    if world_size == 1:
        validate_checkpoint(0, 1, None, str(checkpoint), str(data), BEAM, results, precision)
        return [results.get(timeout=60)]
    return run_ranks(validate_checkpoint, world_size, str(checkpoint), str(data), BEAM)


def test_the_deal_gives_every_rank_a_balanced_share():
    lengths = np.random.default_rng(0).integers(1, 60, size=1001)
    shares = [deal(lengths, r, 4) for r in range(4)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(1001))
    assert max(len(s) for s in shares) - min(len(s) for s in shares) <= 1
    tokens = [int(lengths[s].sum()) for s in shares]
    assert max(tokens) - min(tokens) <= lengths.max()  # each rank's k-th sentence is no longer than the one before
    assert [len(deal(lengths[:1], r, 2)) for r in range(2)] == [1, 0]  # more ranks than sentences


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_rank_translates_the_valid_sources_as_nmt_translate(trained, one_thread, precision):
    from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints

    checkpoint, data = trained
    [(_, figures, hyps)] = _validate(1, checkpoint, data, precision)
    tok = read_tokenizer(data)
    texts = tok.decode([hyps[i] for i in range(len(hyps))])
    translator = Translator(load_checkpoints([checkpoint]), "cpu", precision,
                            TranslateConfig.from_options(beam=BEAM, workers=1, shortlist=False))  # (validation: the
    # whole vocabulary)
    lines = (data / "raw" / "valid.en").read_text().splitlines()
    assert len(lines) == len(hyps) == 300
    assert translator.translate_best(lines) == texts
    valid = ParallelData(data, "valid")
    refs = tok.decode([valid.tgt[i].tolist() for i in range(len(valid))])
    assert figures["valid_bleu"] == sacrebleu.corpus_bleu(texts, [refs]).score
    assert figures["valid_bleu"] > 5  # the model translates: equal figures below are not two zeros


def test_two_ranks_validate_as_one_and_agree(trained):
    checkpoint, data = trained
    [(_, one, hyps)] = _validate(1, checkpoint, data)
    ranks = _validate(2, checkpoint, data)
    (_, first, share0), (_, second, share1) = ranks
    assert first == second  # every rank gets the same figures: the same "best" and patience
    assert first["valid_bleu"] == one["valid_bleu"]
    for name in ("valid_nll", "valid_loss"):
        assert first[name] == pytest.approx(one[name], rel=1e-6)
    assert not set(share0) & set(share1) and abs(len(share0) - len(share1)) <= 1
    assert {**share0, **share1} == hyps  # each sentence decoded once, to the hypothesis of one rank
