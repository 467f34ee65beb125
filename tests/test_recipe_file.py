"""A run's recipe is a file: every run writes RUN_DIR/config.yaml, `nmt train --config FILE` repeats it (options on
the command line override it), `--print-config` prints a preset's, and a bad file is one line naming the key."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import yaml

from nmt_cli.checkpoints.format import load
from nmt_cli.config import preset
from nmt_cli.errors import ConfigError
from nmt_cli.training import recipe_file
from nmt_cli.training.config import TrainConfig


def run_nmt(*args):
    return subprocess.run([sys.executable, "-m", "nmt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def small_run(data_dir, run, *extra):
    return run_nmt("train", data_dir, "-o", run, "--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--layers",
                   "1", "--max-tokens", "256", "--update-freq", "1", "--warmup", "10", "--precision", "fp32",
                   "--threads", "1", "--max-steps", "2", "--seed", "3", *extra)


def without(doc: dict, *keys) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


def test_a_run_writes_its_config_and_config_repeats_the_run(toy_data_dir, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    r = small_run(toy_data_dir, a)
    assert r.returncode == 0, r.stderr
    text = (a / "config.yaml").read_text()
    doc = yaml.safe_load(text)
    assert doc["preset"] == "tiny" and doc["out_dir"] == str(a) and doc["data"] == {"data_dir": str(toy_data_dir)}
    assert doc["model"]["d_model"] == 32 and doc["model"]["encoder_layers"] == 1 and doc["model"]["n_heads"] == 4
    assert "vocab_size" not in doc["model"] and "vocab_size 64" in text  # the data's, in a comment
    # the preset's values filled in; values computed at the start left as given, with this run's in a comment
    assert doc["recipe"]["warmup"] == 10 and doc["recipe"]["update_tokens"] == 2048
    assert doc["recipe"]["max_steps"] == 2 and doc["recipe"]["seed"] == 3 and doc["recipe"]["lr"] is None
    assert doc["machine"]["precision"] == "fp32" and doc["machine"]["gpus"] is None and "this run: cpu" in text

    r = run_nmt("train", "--config", a / "config.yaml", "-o", b)  # DATA_DIR from the file
    assert r.returncode == 0, r.stderr
    assert without(yaml.safe_load((b / "config.yaml").read_text()), "out_dir") == without(doc, "out_dir")
    ja, jb = (json.loads((run / "config.json").read_text()) for run in (a, b))
    assert without(ja["options"], "out_dir") == without(jb["options"], "out_dir")
    assert without(ja, "options") == without(jb, "options")  # resolved: model, batch sizes, lr, device...
    ca, cb = load(a / "checkpoint_last.pt"), load(b / "checkpoint_last.pt")
    assert ca.model_config == cb.model_config  # checkpoints still carry the model configuration
    assert all(torch.equal(ca.model_state[k], cb.model_state[k]) for k in ca.model_state)  # the same run again

    r = run_nmt("train", "--config", a / "config.yaml", "-o", c, "--warmup", "7", "--heads", "2", "--max-steps", "1")
    assert r.returncode == 0, r.stderr
    doc_c = yaml.safe_load((c / "config.yaml").read_text())
    assert doc_c["recipe"]["warmup"] == 7 and doc_c["model"]["n_heads"] == 2 and doc_c["recipe"]["max_steps"] == 1
    assert without(doc_c["model"], "n_heads") == without(doc["model"], "n_heads")
    assert without(doc_c["recipe"], "warmup", "max_steps") == without(doc["recipe"], "warmup", "max_steps")
    jc = json.loads((c / "config.json").read_text())
    assert jc["warmup"] == 7 and jc["model"]["n_heads"] == 2 and jc["max_steps"] == 1


def test_print_config_base_is_the_papers_recipe():
    r = run_nmt("train", "--print-config", "--preset", "base")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = yaml.safe_load(r.stdout)
    model, recipe = doc["model"], doc["recipe"]
    assert (model["d_model"], model["d_ff"], model["n_heads"], model["encoder_layers"], model["decoder_layers"]) == \
        (512, 2048, 8, 6, 6)
    assert model["dropout"] == 0.1 and model["norm_first"] is False and model["share_embeddings"] is True
    assert recipe["warmup"] == 4000 and recipe["label_smoothing"] == 0.1 and recipe["lr"] is None
    assert recipe["adam_betas"] == [0.9, 0.98] and recipe["adam_eps"] == 1e-9
    assert recipe["update_tokens"] == 25000 and recipe["max_steps"] == 100000
    assert doc["data"]["data_dir"] is None and "vocab_size" not in model  # no data: the vocabulary is DATA_DIR's
    big = yaml.safe_load(run_nmt("train", "--print-config", "--preset", "big", "--dropout", "0.1").stdout)["model"]
    assert big["d_model"] == 1024 and big["n_heads"] == 16 and big["dropout"] == 0.1


def test_config_file_values_equal_to_the_preset_follow_preset(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(recipe_file.preview(TrainConfig(None, None, preset="tiny", warmup=7, model={"d_ff": 96})))
    kwargs = recipe_file.read(tiny)
    assert kwargs["preset"] == "tiny" and kwargs["warmup"] == 7 and kwargs["model"] == {"d_ff": 96}
    assert kwargs["max_steps"] is None and kwargs["update_tokens"] is None  # tiny's own: left to the preset
    r = run_nmt("train", "--config", tiny, "--preset", "base", "--print-config")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert doc["model"]["d_model"] == 512 and doc["model"]["d_ff"] == 96  # base's model, the file's override
    assert doc["recipe"]["warmup"] == 7 and doc["recipe"]["max_steps"] == 100000


def test_config_round_trips_and_reads_yaml_1_2_floats(tmp_path):
    cfg = TrainConfig("data", "run", preset="big", model={"d_model": 256, "n_heads": 4}, lr=5e-4,
                      adam_betas=(0.9, 0.997), max_tokens="auto", update_freq=3, max_time=4.5, gpus=2,
                      valid_bleu=True)
    path = tmp_path / "c.yaml"
    path.write_text(recipe_file.preview(cfg))
    assert TrainConfig(**{"data_dir": "x", "out_dir": "y", **recipe_file.read(path)}) == cfg
    path.write_text("recipe:\n  lr: 5e-4\n  warmup: 8000\n  adam_eps: 1E-8\nmachine:\n  dist_timeout: 2\n")
    kwargs = recipe_file.read(path)
    assert kwargs["lr"] == 5e-4 and kwargs["adam_eps"] == 1e-8 and kwargs["warmup"] == 8000
    assert kwargs["dist_timeout"] == 2.0 and isinstance(kwargs["dist_timeout"], float)  # an int for a float


def test_a_fine_tuning_config_holds_only_the_dropouts(tmp_path):
    """A run from init_from's weights takes that model's architecture: its file sets only what such a run may."""
    cfg = TrainConfig("d", "o", init_from="hf:Helsinki-NLP/opus-mt-en-de", model={"dropout": 0.2})
    model = dataclasses.replace(preset("base"), d_model=256, n_heads=4, activation="swish", dropout=0.2)
    path = tmp_path / "ft.yaml"
    path.write_text(recipe_file.render(recipe_file.document(cfg, model), [], {}))
    kwargs = recipe_file.read(path)
    assert kwargs["model"] == {"dropout": 0.2, "attention_dropout": 0.0, "activation_dropout": 0.0}
    assert kwargs["init_from"] == cfg.init_from
    TrainConfig(**kwargs).validate()


@pytest.mark.parametrize("text, message", [
    ("recipe:\n  warmpu: 10\n", "unknown key recipe.warmpu; did you mean recipe.warmup?"),
    ("modle:\n  d_model: 10\n", "unknown key modle; did you mean model?"),
    ("recipe:\n  d_model: 10\n", "unknown key recipe.d_model; it belongs to model: write it as model.d_model"),
    ("warmup: 10\n", "unknown key warmup; it belongs to recipe"),
    ("model:\n  vocab_size: 100\n", "unknown key model.vocab_size; the vocabulary comes from DATA_DIR"),
    ("recipe:\n  resume: true\n", "unknown key recipe.resume; whether to resume is decided by each command"),
    ("recipe:\n  warmup: ten\n", 'recipe.warmup must be an integer or null, got "ten" (text)'),
    ("model:\n  d_model: true\n", "model.d_model must be an integer, got true"),
    ("recipe:\n  adam_betas: [0.9]\n", "recipe.adam_betas must be a list of 2 numbers, got [0.9] (a list)"),
    ("recipe:\n  update_freq: 1.5\n", "recipe.update_freq must be a positive integer or auto, got 1.5"),
    ("machine:\n  compile: 'yes'\n", 'machine.compile must be true or false, got "yes" (text)'),
    ("model: 512\n", "model must be a mapping of keys to values, got 512"),
    ("- model\n- recipe\n", 'is ["model", "recipe"] (a list), not a mapping'),
    ("", "is empty"),
    ("recipe: [1, 2\n", "is not valid YAML"),
    ("preset: huge\n", "unknown preset 'huge'"),
    ("model:\n  activation: gelu\n", "model.activation 'gelu' is not preset base's 'relu'"),
])
def test_a_bad_config_file_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        recipe_file.read(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{path}: ") or str(err.value).startswith(f"--config {path} ")


def test_a_bad_config_is_one_line_and_writes_nothing(toy_data_dir, tmp_path):
    run, path = tmp_path / "run", tmp_path / "bad.yaml"
    path.write_text("recipe:\n  warmup: 100\n  label_smoothin: 0.2\n")
    for args in (["--config", path, toy_data_dir, "-o", run], ["--config", tmp_path / "missing.yaml"],
                 ["--print-config", "--config", path]):
        r = run_nmt("train", *args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and r.stdout == "", r.stderr
        assert ("recipe.label_smoothin; did you mean recipe.label_smoothing?" in lines[0]
                or "missing.yaml: no such file" in lines[0]), lines
    assert not run.exists()
    path.write_text("recipe:\n  warmup: 100\n")  # no data_dir: DATA_DIR must be given
    r = run_nmt("train", "--config", path, "-o", run)
    assert r.returncode == 2 and f"missing argument DATA_DIR; {path} has no data.data_dir" in r.stderr, r.stderr
    assert not run.exists()


@pytest.mark.parametrize("name, save_every, average_last, keep_last", [
    ("tiny", 1000, 5, 5), ("base", 1400, 5, 5), ("big", 600, 20, 20)])
def test_print_config_shows_the_checkpoint_recipe_the_preset_runs(tmp_path, name, save_every, average_last,
                                                                    keep_last):
    """The saves and the averaging a preset runs are numbers in the printed file, with the rule for shorter runs in
    a comment; what the data or the machine decide stays null or auto with a comment saying how; read back, the
    preset's numbers are its defaults again (a shorter --max-steps still saves more often)."""
    r = run_nmt("train", "--print-config", "--preset", name)
    assert r.returncode == 0, r.stderr
    recipe = yaml.safe_load(r.stdout)["recipe"]
    assert (recipe["save_every"], recipe["average_last"], recipe["keep_last"]) == (save_every, average_last, keep_last)
    lines = {line.split(":")[0].strip(): line for line in r.stdout.splitlines() if line.startswith("  ")}
    assert "max_steps / (4 x average_last), at least 50" in lines["save_every"]
    for key in ("max_tokens", "update_freq", "lr", "threads", "gpus", "valid_every"):
        assert "  # " in lines[key], lines[key]
    path = tmp_path / "p.yaml"
    path.write_text(r.stdout)
    kwargs = recipe_file.read(path)
    assert kwargs["save_every"] is None and kwargs["average_last"] is None and kwargs["keep_last"] is None
    path.write_text(r.stdout.replace(f"average_last: {average_last}", "average_last: 8"))
    kwargs = recipe_file.read(path)  # keep_last equal to max(5, the file's average_last): still the default
    assert kwargs["average_last"] == 8 and kwargs["keep_last"] == (None if keep_last == max(5, 8) else keep_last)


def test_every_option_is_declared_once_and_the_command_line_comes_from_it():
    """TrainConfig's fields carry their declarations; the command's options are exactly the declared flags (with
    the model options and the command's own --config and --print-config), the presets' values come from them."""
    import typer

    from nmt_cli.cli import app
    from nmt_cli.training.config import MODEL_OPTIONS, RECIPES, declarations

    declared = declarations()
    assert list(declared) == [f.name for f in dataclasses.fields(TrainConfig)]
    command = typer.main.get_command(app).commands["train"]
    params = {p.name: p for p in command.params}
    flagged = {k for k, o in declared.items() if o.flags}
    assert set(params) == flagged | set(MODEL_OPTIONS) | {"config", "print_config"}
    for name in flagged:
        spec = declared[name]
        assert params[name].help == spec.help
        if spec.flags != ("ARG",):
            assert set(params[name].opts) | set(params[name].secondary_opts) == \
                {o for flag in spec.flags for o in flag.split("/")}
    for preset_name, values in RECIPES.items():
        for key, value in values.items():
            if key != "cpu_max_tokens":
                assert declared[key].per_preset[preset_name] == value
                assert str(value) in (declared[key].show_default or ""), (key, value)
    sections = {o.section for o in declared.values()}
    assert sections == {"top", "recipe", "data", "machine", "model", ""}
    assert all(o.not_in_file for o in declared.values() if o.section == "")
