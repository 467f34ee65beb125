"""The commands that write files, on a full disk (a small tmpfs, mounted where the tests may; skipped with the
reason where they may not) and killed with SIGKILL: one line naming the output and the full disk, exit 1, the
previous output whole, no temporary file; after a kill, the previous output or the whole new one, and the command
run again finishes. bench/faults.py runs the same with 20+ kills per command; here a few, the slow ones under
`make test-fuzz`."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_faults import fill, leftovers, small_filesystem
from helpers_translate import make_checkpoint
from nmt_cli.atomic import os_error_behind

ROOT = Path(__file__).resolve().parents[1]


def nmt(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def digest(path: Path) -> list:
    return [path.read_bytes()] if path.is_file() else sorted((str(p.relative_to(path)), p.read_bytes())
                                                             for p in path.rglob("*") if p.is_file())


def assert_one_line_about_the_full_disk(done, out: Path):
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and lines, done.stderr
    assert str(out) in lines[-1] and "No space left on device" in lines[-1], done.stderr


# ------------------------------------------------------------------------------------ errors behind errors


def test_the_os_error_behind_a_library_error_is_found():
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("unexpected pos 3090560 vs 3090448")  # noqa: B904 (as torch does)
    except RuntimeError as exc:
        assert os_error_behind(exc).errno == 28
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert os_error_behind(rust).errno == 28 and os_error_behind(rust).strerror == "No space left on device"
    try:
        try:
            raise FileNotFoundError(2, "No such file")
        except OSError:
            raise ValueError("a bad input, said in our own words") from None
    except ValueError as exc:
        assert os_error_behind(exc) is None  # `from None`: the OSError was handled, not hidden


# ------------------------------------------------------------------------------------ disk full, each writer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    return make_checkpoint(tmp_path_factory.mktemp("faults") / "model.pt", toy_tokenizer_bytes, seed=0)


WRITERS = {  # name: (arguments, OUT standing for the output; the output's name; whether a previous one may stay)
    "export-ct2": (["export", "ctranslate2", "CKPT", "-o", "OUT", "--force"], "ct2", True),
    "export-hf": (["export", "huggingface", "CKPT", "-o", "OUT", "--force"], "hf", True),
    "push-staging": (["push", "CKPT", "me/model", "--huggingface", "--ctranslate2", "--dry-run", "OUT"], "staged",
                     False),
    "import": (["import", "MARIAN", "-o", "OUT"], "imported.pt", True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_full_disk_is_one_line_keeps_the_previous_output_and_leaves_no_temporary_file(name, ckpt, tmp_path):
    """The output on a filesystem where half of it fits (a previous output, where there is one, stays whole).
    Found this way: export huggingface printed safetensors' traceback, push named its temporary folder."""
    pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    args, output, previous = WRITERS[name]
    marian = tmp_path / "marian"
    if name == "import":
        assert nmt("export", "huggingface", ckpt, "-o", marian).returncode == 0
    reference = tmp_path / ("reference-" + output)
    argv = [str(ckpt) if a == "CKPT" else str(marian) if a == "MARIAN" else a for a in args]
    done = nmt(*[str(reference) if a == "OUT" else a for a in argv])
    assert done.returncode == 0, done.stderr
    with small_filesystem(tmp_path / "small", "8m") as small:
        out = small / output
        if previous:
            shutil.copytree(reference, out) if reference.is_dir() else shutil.copy(reference, out)
            before = digest(out)
        fill(small, size_of(reference) // 2)
        done = nmt(*[str(out) if a == "OUT" else a for a in argv])
        assert_one_line_about_the_full_disk(done, out)
        assert (digest(out) == before) if previous else not out.exists()
        assert leftovers(small) == []


@pytest.mark.slow
def test_prepare_on_a_full_disk_names_the_path_and_resumes_once_there_is_space(tmp_path):
    """Found this way: the line said "No space left on device" without the path."""
    with small_filesystem(tmp_path / "small", "8m") as small:
        fill(small, 1_000_000)
        out = small / "data"
        done = nmt("prepare", "sample", "-o", out)
        assert_one_line_about_the_full_disk(done, out)
        assert "run the same command again" in done.stderr and not (out / "manifest.json").exists()
        (small / "filler").unlink()
        done = nmt("prepare", "sample", "-o", out)
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "manifest.json").read_text())["splits"]["train"]["kept"] > 0
        assert leftovers(small) == []


def test_the_servers_files_and_suggestions_on_a_full_disk_keep_nothing_partial(tmp_path, monkeypatch):
    """A translated file that does not fit is not left half-written in the store; a suggestion that does not fit
    is taken back from the file, which stays whole JSON lines (the server answers 507 for both)."""
    import tempfile

    from nmt_cli.serve.files import FileStore
    from nmt_cli.serve.suggestions import Suggestions

    with small_filesystem(tmp_path / "small", "1m") as small:
        monkeypatch.setattr(tempfile, "tempdir", str(small))
        store = FileStore(60)
        kept = Suggestions(small / "corrections.jsonl")
        kept.add("the cat", "die Katze", "en", "de", None)
        before = (small / "corrections.jsonl").read_bytes()
        fill(small, 2048)
        with pytest.raises(OSError, match="No space left"):
            store.add(b"x" * 100_000, "big.txt", "de")
        assert list(store.dir.iterdir()) == []
        with pytest.raises(OSError, match="No space left"):
            kept.add("a" * 100_000, "b", "en", "de", None)
        assert (small / "corrections.jsonl").read_bytes() == before


def test_a_killed_servers_files_are_removed_by_the_next_server(tmp_path, monkeypatch):
    """Found by bench/faults.py: each kill -9 of nmt serve left its folder of users' translated files in the
    temporary directory for good."""
    import tempfile

    from nmt_cli.serve.files import FileStore

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"nmt-serve-files-{int(gone.stdout)}-abc"
    alive = tmp_path / f"nmt-serve-files-{os.getpid()}-def"
    for folder in (orphan, alive):
        folder.mkdir()
        (folder / "0123").write_bytes(b"a user's translated file")
    store = FileStore(60)
    assert not orphan.exists() and (alive / "0123").exists() and store.dir.name.startswith(f"nmt-serve-files-{os.getpid()}-")
    store.close()
    assert not store.dir.exists()


# ------------------------------------------------------------------------------------ corrupt inputs


def _truncate(path: Path, by: int = 3) -> None:
    os.truncate(path, path.stat().st_size - by)


@pytest.mark.parametrize("damage,named,words", [
    (lambda d: _truncate(d / "train.en.idx"), "train.en.idx", "truncated"),
    (lambda d: _truncate(d / "train.de.bin", 4), "train.de.bin", "does not match its index"),
    (lambda d: (d / "spm.model").write_bytes(b"not a model"), "spm.model", "not a valid sentencepiece model"),
    (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text().replace('"vocab_size": ',
                                                                                          '"vocab_size": 1')),
     "manifest.json", "says vocab_size"),
    (lambda d: (d / "manifest.json").write_text('{"format_version": 1, "src_lang": "en"'), "manifest.json",
     "not valid JSON"),
])
def test_damaged_prepared_data_is_one_line_naming_the_file(toy_data_dir, damage, named, words):
    """Found this way: a truncated .idx was numpy's ValueError, a damaged spm.model did not say which file, an
    edited vocab_size was an IndexError deep in the embedding."""
    from nmt_cli.data.store import ParallelData, check_vocab_size, load_manifest, read_tokenizer
    from nmt_cli.errors import DataError

    damage(toy_data_dir)
    with pytest.raises(DataError) as exc:
        manifest = load_manifest(toy_data_dir)
        check_vocab_size(toy_data_dir, manifest, read_tokenizer(toy_data_dir))
        ParallelData(toy_data_dir, "train", manifest)
    assert str(toy_data_dir / named) in str(exc.value) and words in str(exc.value) and "\n" not in str(exc.value)


def _records(path: Path) -> dict[str, tuple[int, int]]:
    """{record name: (offset of its bytes in the file, their size)} of a checkpoint's zip archive (a record's bytes
    follow its local header: 30 bytes, its name, its extra field)."""
    import zipfile

    data = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
    out = {}
    for info in infos:
        at = info.header_offset
        name_len, extra_len = (int.from_bytes(data[at + i:at + i + 2], "little") for i in (26, 28))
        out[info.filename] = (at + 30 + name_len + extra_len, info.file_size)
    return out


def _flip_one_byte_of_a_weight(ckpt: Path, out: Path) -> Path:
    """A copy of `ckpt` with one byte flipped inside the storage of its largest weight."""
    from nmt_cli.checkpoints.format import load

    weight = max(load(ckpt).model_state.values(), key=lambda t: t.numel()).numpy().tobytes()
    data = bytearray(ckpt.read_bytes())
    start = next(start for start, size in _records(ckpt).values() if data[start:start + size] == weight)
    data[start + len(weight) // 2] ^= 0x10
    out.write_bytes(bytes(data))
    return out


def test_a_bit_flipped_in_the_weights_is_refused_where_torch_would_load_it(ckpt, tmp_path):
    """torch.load does not compare the CRC-32s torch.save writes: the flipped file loads with other weights.
    nmt compares them before loading, and the mapped load (the configuration only) stays unchecked."""
    from nmt_cli.checkpoints.format import _torch_load, load
    from nmt_cli.errors import CheckpointError

    damaged = _flip_one_byte_of_a_weight(ckpt, tmp_path / "damaged.pt")
    good, bad = _torch_load(ckpt, "cpu", verify=False), _torch_load(damaged, "cpu", verify=False)
    differ = [k for k in good["model"] if not torch_equal(good["model"][k], bad["model"][k])]
    assert len(differ) == 1, differ  # what the check exists for: without it, a silent wrong weight
    with pytest.raises(CheckpointError) as exc:
        load(damaged)
    message = str(exc.value)
    assert message.startswith(f"{damaged}: damaged") and "use another checkpoint" in message and "\n" not in message
    assert load(damaged, mmap=True).model_config == load(ckpt).model_config


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


@pytest.mark.parametrize("command", ["translate", pytest.param("average", marks=pytest.mark.slow),
                                     pytest.param("export", marks=pytest.mark.slow)])
def test_commands_refuse_a_bit_flipped_checkpoint_in_one_line(command, ckpt, tmp_path):
    """Refused in one line, nothing written; the intact checkpoint runs. (average and export: `make test-fuzz`.)"""
    if command == "export":
        pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    damaged = _flip_one_byte_of_a_weight(ckpt, tmp_path / "damaged.pt")
    (tmp_path / "in.txt").write_text("the cat sees the dog\n")
    args = {"translate": ["translate", "-m", "MODEL", "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt"],
            "average": ["average", ckpt, "MODEL", "-o", tmp_path / "avg.pt"],
            "export": ["export", "ctranslate2", "MODEL", "-o", tmp_path / "ct2"]}[command]
    done = nmt(*[damaged if a == "MODEL" else a for a in args])
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(damaged) in lines[0] and "damaged" in lines[0] and "use another checkpoint" in lines[0], lines
    assert not [p for p in tmp_path.iterdir() if p.name not in ("damaged.pt", "in.txt")]  # nothing written
    intact = nmt(*[ckpt if a == "MODEL" else a for a in args])
    assert intact.returncode == 0, intact.stderr


def test_a_checkpoint_whose_tokenizer_is_damaged_is_one_line_naming_the_file(ckpt, tmp_path):
    """Found this way: a bit flip in the tokenizer's record said "not a valid sentencepiece model" without the
    checkpoint's name. (A flip is now refused by the CRC-32 check; a file saved with a bad tokenizer and its own
    valid checksums is still one line.)"""
    import torch

    from nmt_cli.checkpoints.format import load, to_dict
    from nmt_cli.errors import CheckpointError

    data = to_dict(load(ckpt))
    spm = bytearray(data["tokenizer"].numpy().tobytes())
    spm[:64] = bytes(64)
    data["tokenizer"] = torch.frombuffer(spm, dtype=torch.uint8)
    damaged = tmp_path / "damaged.pt"
    torch.save(data, damaged)
    with pytest.raises(CheckpointError, match=r"damaged\.pt: its tokenizer is not a valid sentencepiece model"):
        load(damaged)


# ------------------------------------------------------------------------------------ kill -9 (bench/faults.py)


def bench_faults():
    spec = importlib.util.spec_from_file_location("bench_faults", ROOT / "bench" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", ["average", "export-ct2", "import", "push-staging", "prepare"])
def test_killed_at_random_moments_the_output_is_never_partial_and_a_rerun_finishes(name, tmp_path_factory):
    """A few kills of bench/faults.py's; its --trials 20 run gives the figures of docs/results.md#reliability.
    (`nmt train` killed: tests/test_train.py.)"""
    pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    import random

    faults = bench_faults()
    work = tmp_path_factory.getbasetemp() / "faults-work"
    faults.make_inputs(work)
    tally = faults.kill_trials(faults.writers(work)[name], work, 2, random.Random(55))
    assert tally.trials == 2 and tally.lost == 0, (tally.outcomes, tally.notes)


@pytest.mark.slow
def test_a_killed_server_never_gave_a_partial_file_and_starts_again(tmp_path_factory):
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    import random

    faults = bench_faults()
    work = tmp_path_factory.getbasetemp() / "faults-work"
    faults.make_inputs(work)
    tally = faults.serve_trials(work, 2, random.Random(55))
    assert tally.trials == 2 and tally.lost == 0 and tally.left_after_rerun == 0, (tally.outcomes, tally.notes)


def test_translate_to_a_full_disk_names_the_file_and_keeps_the_previous_one(ckpt, tmp_path):
    """Found this way: `nmt translate -o` truncated the previous file at once and, when the disk filled up, left
    part of the new one and a line without the path. The output is now written whole or not at all."""
    (tmp_path / "in.txt").write_text("the cat sees the dog\n" * 3000)
    with small_filesystem(tmp_path / "small", "1m") as small:
        out = small / "out.txt"
        out.write_text("the previous translation\n")
        fill(small, 2048)
        done = nmt("translate", "-m", ckpt, "-i", tmp_path / "in.txt", "-o", out, "--beam", "1", "--max-len-b", "4")
        assert_one_line_about_the_full_disk(done, out)
        assert "keeps its previous content" in done.stderr and out.read_text() == "the previous translation\n"
        assert leftovers(small) == []


# ------------------------------------------------------------------------------------ what a kill leaves behind


def _ended_pid() -> int:
    """The process id of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_writer_removes_the_staging_folders_of_ended_writers_only(tmp_path):
    """.TARGET.PID@HOST.XXXX.tmp: removed where PID has ended on this host; kept where it is alive (a writer
    filling it now) or of another host (a shared filesystem: its process cannot be looked at from here)."""
    from nmt_cli.atomic import owner_tag
    from nmt_cli.export.folder import atomic_folder

    host = owner_tag().split("@")[1]
    dead, live, other = (tmp_path / f".out.{tag}.k3j_x9ab.tmp" for tag in
                         (f"{_ended_pid()}@{host}", owner_tag(), f"{_ended_pid()}@not-{host}"))
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "model.bin").write_bytes(b"half")
    (tmp_path / ".other.1@x.tmp").mkdir()  # not this target's, not ours: never looked at
    with atomic_folder(tmp_path / "out") as tmp:
        assert tmp.name.startswith(f".out.{owner_tag()}.") and tmp.name.endswith(".tmp")
        (tmp / "model.bin").write_bytes(b"whole")
    assert not dead.exists() and live.exists() and other.exists() and (tmp_path / ".other.1@x.tmp").exists()
    assert (tmp_path / "out" / "model.bin").read_bytes() == b"whole"


def test_a_previous_export_a_kill_left_moved_aside_is_put_back(tmp_path):
    """Killed between moving the previous export aside and renaming the new one into place: the target is
    missing and the previous export is whole in .TARGET.PID@HOST.old; the next writer puts it back first."""
    from nmt_cli.atomic import owner_tag
    from nmt_cli.errors import ConfigError
    from nmt_cli.export.folder import atomic_folder, remove_stale

    host = owner_tag().split("@")[1]
    old = tmp_path / f".out.{_ended_pid()}@{host}.old"
    old.mkdir()
    (old / "model.bin").write_bytes(b"previous")
    with pytest.raises(ConfigError, match="already exists"), atomic_folder(tmp_path / "out"):
        pass  # without --force the previous export is kept
    assert (tmp_path / "out" / "model.bin").read_bytes() == b"previous" and not old.exists()
    old.mkdir()  # killed after the new one was renamed into place: the one moved aside is removed
    assert remove_stale(tmp_path / "out") == [old] and not old.exists()


_KILLED_AFTER_WRITING_THE_WEIGHTS = """
import os, signal, sys
from ctranslate2.specs import model_spec
save = model_spec.ModelSpec.save
def save_then_die(self, *args, **kwargs):  # SIGKILL, with the weights written into the staging folder
    save(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
model_spec.ModelSpec.save = save_then_die
from nmt_cli.cli import main
sys.argv = ["nmt", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "push-staging"])
def test_after_a_kill_mid_export_the_rerun_leaves_no_staging_folder(command, ckpt, tmp_path):
    """kill -9 with the staging folder half filled (the process kills itself once CTranslate2 has written the
    weights: a tiny export is staged for milliseconds), then the same command again: the whole export, no .tmp."""
    pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    out = tmp_path / "out"
    args = {"export": ["export", "ctranslate2", ckpt, "-o", out, "--force"],
            "push-staging": ["push", ckpt, "me/model", "--ctranslate2", "--dry-run", out]}[command]
    killed = subprocess.run([sys.executable, "-c", _KILLED_AFTER_WRITING_THE_WEIGHTS, *map(str, args)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    assert not out.exists() and len(list(tmp_path.glob(".out.*.tmp"))) == 1  # what the kill left
    done = nmt(*args)
    assert done.returncode == 0, done.stderr
    assert (out / "model.bin").is_file() or (out / "ctranslate2" / "model.bin").is_file()
    assert leftovers(tmp_path) == []


def test_a_push_removes_the_staging_folders_of_ended_pushes_only(tmp_path, monkeypatch):
    """A push stages in the system's temporary folder (nmt-push-PID@HOST.XXXX); one that a kill left is removed
    by the next push, a live push's is kept."""
    import tempfile

    from nmt_cli.atomic import owner_tag
    from nmt_cli.hub.push import staging_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = owner_tag().split("@")[1]
    dead, live = tmp_path / f"nmt-push-{_ended_pid()}@{host}.ab_12cd", tmp_path / f"nmt-push-{owner_tag()}.zz9"
    for folder in (dead, live):
        (folder / "repo").mkdir(parents=True)
    with staging_folder() as tmp:
        assert Path(tmp).name.startswith(f"nmt-push-{owner_tag()}.")
        assert not dead.exists() and live.exists()
    assert not Path(tmp).exists()


def test_a_write_removes_the_temporary_files_of_ended_writers_of_the_same_file_only(ckpt, tmp_path):
    """What `kill -9` during `nmt average` or `nmt import` leaves (avg.pt.PID@HOST.XXXX.tmp) is removed by the next
    write of avg.pt; a live writer's, another file's and another host's stay."""
    from nmt_cli.atomic import owner_tag
    from nmt_cli.checkpoints.format import load, save

    host = owner_tag().split("@")[1]
    dead, live, other_host, other_file = (tmp_path / name for name in (
        f"avg.pt.{_ended_pid()}@{host}.a1b2c3d4.tmp", f"avg.pt.{owner_tag()}.a1b2c3d4.tmp",
        f"avg.pt.{_ended_pid()}@not-{host}.a1b2c3d4.tmp", f"other.pt.{_ended_pid()}@{host}.a1b2c3d4.tmp"))
    for path in (dead, live, other_host, other_file):
        path.write_bytes(b"half a checkpoint")
    save(load(ckpt), tmp_path / "avg.pt")
    assert not dead.exists() and live.exists() and other_host.exists() and other_file.exists()


def test_a_bit_flipped_marian_pytorch_model_bin_is_refused_at_import(tmp_path):
    """A downloaded MarianMT folder's pytorch_model.bin goes through the same CRC-32 check."""
    import torch

    from nmt_cli.errors import CheckpointError
    from nmt_cli.importers.marian import load_weights

    weight = torch.arange(4096, dtype=torch.float32)
    torch.save({"model.shared.weight": weight}, tmp_path / "pytorch_model.bin")
    assert torch.equal(load_weights(tmp_path)["model.shared.weight"], weight)
    data = bytearray((tmp_path / "pytorch_model.bin").read_bytes())
    start = next(start for start, size in _records(tmp_path / "pytorch_model.bin").values() if size == 4096 * 4)
    data[start + 100] ^= 0x01
    (tmp_path / "pytorch_model.bin").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: damaged .*; re-download the model$"):
        load_weights(tmp_path)
