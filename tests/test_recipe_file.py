"""A run's recipe is a file: every run writes RUN_DIR/config.yaml, `nmt train --config FILE` repeats it (options on
the command line override it), `--print-config` prints a preset's, and a bad file is one line naming the key."""

from __future__ import annotations

import pytest

from nmt_cli.errors import ConfigError
from nmt_cli.training import recipe_file
from nmt_cli.training.config import TrainConfig


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


