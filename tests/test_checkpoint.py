"""Self-contained, atomic, safe checkpoints."""

import dataclasses
import io
import os
import pickle
import random
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from nmt_cli.checkpoints import format as ckpt_mod
from nmt_cli.checkpoints.format import Checkpoint, load, save
from nmt_cli.config import preset
from nmt_cli.data.tokenizer import Tokenizer
from nmt_cli.errors import CheckpointError
from nmt_cli.model import Transformer


@pytest.fixture()
def small_ckpt(toy_tokenizer_bytes):
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=Tokenizer(toy_tokenizer_bytes).vocab_size, d_model=32, d_ff=64)
    model = Transformer(cfg)
    return Checkpoint(cfg, model.state_dict(), toy_tokenizer_bytes, {"src": "en", "tgt": "de"},
                      train_state={"step": 7, "rng": torch.get_rng_state(), "py": (3, (1, 2), None)})


def test_round_trip_gives_identical_outputs(tmp_path, small_ckpt):
    path = tmp_path / "m.pt"
    save(small_ckpt, path)
    loaded = load(path)
    assert loaded.model_config == small_ckpt.model_config
    assert loaded.tokenizer == small_ckpt.tokenizer and loaded.langs == {"src": "en", "tgt": "de"}
    assert loaded.train_state["step"] == 7
    a, b = Transformer(small_ckpt.model_config), loaded.build_model()
    a.load_state_dict(small_ckpt.model_state)
    a.eval()
    src, tgt = torch.randint(4, 40, (2, 6)), torch.randint(4, 40, (2, 5))
    assert torch.equal(a(src, tgt), b(src, tgt))
    tok = loaded.tokenizer_obj()
    assert tok.decode(tok.encode(["the cat sees a dog"])) == ["the cat sees a dog"]
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"


def test_a_model_for_translation_shares_the_checkpoints_weights(tmp_path, small_ckpt):
    """build_model(share=True): the model's tensors are the checkpoint's (one copy of the weights in memory while the
    Translator packs them), converted only where a stored dtype differs; the outputs are the copied model's."""
    state = dict(small_ckpt.model_state)
    state["embed.weight"] = state["embed.weight"].half()  # e.g. a checkpoint stored in float16
    ckpt = dataclasses.replace(small_ckpt, model_state=state)
    shared, copied = ckpt.build_model(share=True), ckpt.build_model()
    for name, tensor in shared.state_dict().items():
        if name in state and name != "embed.weight":
            assert tensor.data_ptr() == state[name].data_ptr(), name
        assert tensor.dtype == copied.state_dict()[name].dtype, name
    assert shared.embed.weight.dtype == torch.float32
    assert not any(t.is_meta for t in [*shared.parameters(), *shared.buffers()])  # built without weights, then given
    assert torch.equal(shared.positions, copied.positions)
    assert nn.Linear.reset_parameters is not None and nn.Linear(8, 8).weight.abs().sum() > 0  # initialising restored
    src, tgt = torch.randint(4, 40, (2, 6)), torch.randint(4, 40, (2, 5))
    with torch.no_grad():
        assert torch.equal(shared(src, tgt), copied(src, tgt))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickle_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "nmt-checkpoint", "version": 1, "payload": _Evil()}, path)
    with pytest.raises(CheckpointError, match=r"refused: it holds a \w+\.system object.*could run code"):
        load(path)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(CheckpointError, match="plain Python pickle, not a PyTorch checkpoint"):
        load(raw)


def _unreadable_files(tmp_path: Path, good: bytes) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its error must say)."""
    zip_buf = io.BytesIO()
    with zipfile.ZipFile(zip_buf, "w") as z:
        z.writestr("notes.txt", "hello")
    legacy = tmp_path / "legacy.pt"
    torch.save({"x": torch.zeros(500)}, legacy, _use_new_zipfile_serialization=False)
    contents = {
        "random": (bytes(random.Random(0).randrange(1, 128) for _ in range(4096)), "not a PyTorch checkpoint"),
        "text": (b"hello world\n", "not a PyTorch checkpoint"),
        "pickle4": (pickle.dumps({"a": 1}, protocol=4), "plain Python pickle"),
        "pickle2": (pickle.dumps({"a": 1}, protocol=2), "plain Python pickle"),
        "truncated": (good[: len(good) // 2], "truncated or corrupt (its zip archive is incomplete"),
        "truncated-legacy": (legacy.read_bytes()[:1500], "truncated or corrupt"),
        "other-zip": (zip_buf.getvalue(), "a zip archive but not a PyTorch checkpoint"),
    }
    out = {}
    for name, (data, words) in contents.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        out[name] = (path, words)
    return out


def test_unreadable_files_say_why_in_one_line_of_our_own_without_warnings(tmp_path, small_ckpt):
    """Each kind of unreadable file gets its own cause (not torch's text, cut or whole), and torch's warnings
    (e.g. about the pickle protocol) do not reach the user."""
    good = tmp_path / "good.pt"
    save(small_ckpt, good)
    for name, (path, words) in _unreadable_files(tmp_path, good.read_bytes()).items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(CheckpointError) as exc:
                load(path)
        message = str(exc.value)
        assert words in message and str(path) in message, (name, message)
        assert "\n" not in message and "weights_only" not in message and "torch.load" not in message, (name, message)
        assert caught == [], (name, [str(w.message) for w in caught])


def test_truncated_file_gives_clear_error(tmp_path, small_ckpt):
    path = tmp_path / "m.pt"
    save(small_ckpt, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"m\.pt.*(truncated|corrupt)"):
        load(path)


def test_foreign_too_new_missing_and_empty_files(tmp_path, small_ckpt):
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="not an nmt checkpoint"):
        load(foreign)
    newer = tmp_path / "newer.pt"
    data = ckpt_mod.to_dict(small_ckpt)
    data["version"] = ckpt_mod.VERSION + 1
    torch.save(data, newer)
    with pytest.raises(CheckpointError, match="newer.*upgrade"):
        load(newer)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load(tmp_path / "missing.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load(tmp_path / "empty.pt")


def test_interrupted_save_leaves_old_checkpoint_valid(tmp_path, small_ckpt, monkeypatch):
    path = tmp_path / "m.pt"
    save(small_ckpt, path)
    before = path.read_bytes()

    def crash(obj, f):
        f.write(b"partial data")
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt_mod.torch, "save", crash)
    with pytest.raises(CheckpointError, match="cannot write .*m.pt: No space left on device; m.pt keeps its previous"):
        save(small_ckpt, path)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp"))
    monkeypatch.undo()
    assert load(path).train_state["step"] == 7


def test_a_writer_library_error_hiding_the_full_disk_is_reported_as_the_full_disk(tmp_path, small_ckpt, monkeypatch):
    """torch's zip writer, failing again as it closes after the disk filled up, raises RuntimeError("unexpected
    pos ...") while handling the OSError: the user hears the OSError, in the one line of write_error."""
    path = tmp_path / "m.pt"

    def full_then_enforce_fail(obj, f):
        try:
            raise OSError(28, "No space left on device")
        finally:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3090560 vs 3090448")

    monkeypatch.setattr(ckpt_mod.torch, "save", full_then_enforce_fail)
    with pytest.raises(CheckpointError, match=r"cannot write .*m\.pt: No space left on device; m\.pt was not written"):
        save(small_ckpt, path)
    assert not list(tmp_path.iterdir())
