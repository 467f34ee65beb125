"""A run's recipe as a YAML file: `RUN_DIR/config.yaml` (every run writes one), `nmt train --config FILE` (reads
one) and `nmt train --print-config` (prints one).

The keys are TrainConfig's and ModelConfig's field names, in the sections TrainConfig's declarations name
(training/config.py: each option's `section`), so an option added to TrainConfig joins the file by itself:

    preset, init_from, out_dir   what the run starts from, where it writes
    model:     the ModelConfig's fields: the preset's, with the run's overrides (the vocabulary is the data's)
    recipe:    optimisation, batching, stopping, checkpoints, validation, seed
    data:      data_dir
    machine:   precision, processes, threads, compilation, timeouts, log lines

What is written: the values a preset fills in (the model, and every option declared with a value per preset:
warmup, update_tokens, max_steps, save_every, average_last; keep_last from average_last) as numbers, with the
rule for shorter runs in a comment; a value a run computes when it starts, from other values or from the machine
(null or auto: lr from d_model and warmup, the batch sizes, the GPU count, threads), as given, with how it is
decided (and, in a run's file, what this run computed) in a comment: the file repeats the run and stays valid on
another machine. What is read: a value equal to the file's preset's is the preset's default, so that `--preset`
on the command line changes it. An unknown key, a wrong type (checked by pydantic against the field's type) or a
file that is not a YAML mapping is one line naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import types
import typing
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from nmt_cli import __version__
from nmt_cli.config import PRESETS, ModelConfig, preset
from nmt_cli.errors import ConfigError
from nmt_cli.training.config import (
    FINE_TUNE_OVERRIDES,
    KEEP_AT_LEAST,
    MODEL_OVERRIDES,
    TrainConfig,
    declarations,
    recipe,
)

_DECLARED = declarations()
TOP = tuple(sorted((k for k, o in _DECLARED.items() if o.section == "top"), key=lambda k: k == "out_dir"))
DATA = tuple(k for k, o in _DECLARED.items() if o.section == "data")
MACHINE = tuple(k for k, o in _DECLARED.items() if o.section == "machine")
RECIPE = tuple(k for k, o in _DECLARED.items() if o.section == "recipe")
NOT_IN_FILE = {  # fields and keys a file does not set, and why
    **{k: o.not_in_file for k, o in _DECLARED.items() if o.not_in_file},
    "vocab_size": "the vocabulary comes from DATA_DIR (nmt prepare --vocab-size); remove it",
    "pad_id": "the padding id is fixed by nmt's tokenizers; remove it",
}
MODEL = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in NOT_IN_FILE)
SECTIONS = {"model": MODEL, "recipe": RECIPE, "data": DATA, "machine": MACHINE}
# recipe keys written as the preset's value when unset: those declared per preset, and keep_last (from average_last)
PRESET_FILLED = (*(k for k in RECIPE if _DECLARED[k].per_preset), "keep_last")
_FOLLOWS = "A value equal to the preset's is read as the preset's default: it follows --preset."
_EXPECTED = {"max_tokens": "a positive integer, auto or null", "update_freq": "a positive integer or auto"}


def preset_value(name: str, key: str, values: dict):
    """What preset `name` gives recipe key `key` when it is left unset, the file's or run's other `values` given
    (keep_last follows average_last)."""
    if key == "keep_last":
        return max(KEEP_AT_LEAST, values.get("average_last") or recipe(name, "average_last"))
    return recipe(name, key)


def notes_for(section: str, keys, values: dict) -> dict[str, str]:
    """The comments on `section`'s keys: how a null or auto is decided, and the rule behind a preset's value."""
    notes = {}
    for key in keys:
        spec = _DECLARED[key]
        rule = spec.note or spec.show_default
        if rule and (values.get(key) in (None, "auto") or key in PRESET_FILLED):
            notes[f"{section}.{key}"] = rule
    return notes


# ------------------------------------------------------------------------------------------------------ writing


def document(cfg: TrainConfig, model: ModelConfig | None = None) -> dict:
    """The file's content as data: `cfg` with the preset's values filled in; `model` is the run's model (None: the
    preset's with `cfg.model`, or only `cfg.model` when the run starts from `init_from`'s architecture)."""
    values = cfg.to_dict()
    if model is None and cfg.init_from is None:
        model = preset(cfg.preset, **cfg.model)
    if cfg.init_from is not None:
        section = ({k: getattr(model, k) for k in FINE_TUNE_OVERRIDES} if model is not None else dict(cfg.model))
    else:
        section = {k: getattr(model, k) for k in MODEL}
    recipe_ = {k: values[k] for k in RECIPE}
    for key in PRESET_FILLED:
        if recipe_[key] is None:
            recipe_[key] = preset_value(cfg.preset, key, values)
    doc = {k: values[k] for k in TOP}
    doc.update(model=section, recipe=recipe_, data={k: values[k] for k in DATA},
               machine={k: values[k] for k in MACHINE})
    return _plain(doc)


def for_run(plan) -> str:
    """RUN_DIR/config.yaml for a planned run (training/plan.py's RunPlan): absolute paths, and what the run
    computed (peak lr, batch sizes, device) in comments."""
    from nmt_cli.training.schedule import peak_lr

    cfg, mc, batch, launch = plan.cfg, plan.model_config, plan.batching, plan.launch
    init_from = cfg.init_from
    if init_from is not None and Path(init_from).exists():
        init_from = os.path.abspath(init_from)
    cfg = dataclasses.replace(cfg, data_dir=os.path.abspath(cfg.data_dir), out_dir=os.path.abspath(cfg.out_dir),
                              init_from=init_from)
    notes = {"model": f"vocab_size {mc.vocab_size}: DATA_DIR's vocabulary",
             "data": f"{plan.langs['src']} -> {plan.langs['tgt']}",
             "machine": f"this run: {launch.device_type}, {launch.world_size} process(es), {launch.precision}"
                        + (f", {plan.threads} thread(s) each" if plan.threads else "")}
    if cfg.init_from is not None:
        notes["model"] += (f"; the rest of the architecture is init_from's (d_model {mc.d_model}, "
                           f"{mc.encoder_layers}+{mc.decoder_layers} layers, {mc.activation})")
    values = cfg.to_dict()
    notes.update(notes_for("recipe", RECIPE, values))
    notes.update(notes_for("machine", MACHINE, values))
    for key, ran in (("save_every", plan.save_every), ("average_last", plan.average_last),
                     ("keep_last", plan.keep_last), ("valid_every", plan.valid_every),
                     ("save_every_minutes", plan.save_minutes), ("valid_every_minutes", plan.valid_minutes)):
        if values[key] is None:
            notes[f"recipe.{key}"] = f"this run: {ran}; " + notes.get(f"recipe.{key}", "")
    if cfg.lr is None:
        notes["recipe.lr"] = f"this run: peak {peak_lr(mc.d_model, plan.warmup):.3g} = d_model^-0.5 * warmup^-0.5"
    if cfg.max_tokens in (None, "auto"):
        notes["recipe.max_tokens"] = f"this run: {batch.max_tokens}"
    if cfg.update_freq == "auto":
        notes["recipe.update_freq"] = (f"this run: {batch.update_freq} ({batch.max_tokens} tokens x "
                                       f"{batch.update_freq} x {batch.world_size} process(es))")
    header = [f"The recipe of the nmt train run {cfg.out_dir} (nmt {__version__}, torch {_torch_version()}).",
              f"Repeat it: nmt train --config {Path(cfg.out_dir) / 'config.yaml'} -o NEW_RUN_DIR",
              "(options given on the command line override the file).",
              "null and auto are computed when a run starts (this run's values are in comments).", _FOLLOWS]
    return render(document(cfg, mc), header, notes)


def preview(cfg: TrainConfig) -> str:
    """What `nmt train --print-config` prints: the recipe a run with `cfg` would use, before any data is read."""
    from nmt_cli.training.schedule import peak_lr

    values = cfg.to_dict()
    notes = {"model": "vocab_size: DATA_DIR's vocabulary", **notes_for("recipe", RECIPE, values),
             **notes_for("machine", MACHINE, values)}
    if cfg.init_from is not None:
        notes["model"] += "; the architecture is init_from's"
    elif cfg.lr is None:
        d_model = cfg.model.get("d_model", PRESETS[cfg.preset].d_model)
        warmup = cfg.warmup or recipe(cfg.preset, "warmup")
        notes["recipe.lr"] = f"peak {peak_lr(d_model, warmup):.3g} = d_model^-0.5 * warmup^-0.5"
    header = [f"nmt train --print-config --preset {cfg.preset} (nmt {__version__}, torch {_torch_version()}).",
              "Train with it: nmt train --config FILE DATA_DIR -o RUN_DIR (options given on the command line "
              "override the file).",
              "null and auto are computed when the run starts, from the data and the machine.", _FOLLOWS]
    return render(document(cfg), header, notes)


def render(doc: dict, header: list[str], notes: dict[str, str]) -> str:
    """YAML text: `header` as comment lines, then `doc` (sections one level deep), with `notes[section]` or
    `notes["section.key"]` as a comment at the end of that line."""
    lines = [f"# {line}" for line in header]
    for name, value in doc.items():
        if isinstance(value, dict):
            lines.append(_noted(f"{name}:" + ("" if value else " {}"), notes.get(name)))
            lines += [_noted("  " + _line(key, v), notes.get(f"{name}.{key}")) for key, v in value.items()]
        else:
            lines.append(_noted(_line(name, value), notes.get(name)))
    return "\n".join(lines) + "\n"


def _line(key: str, value) -> str:
    """`key: value` on one line (a list in flow style: `[0.9, 0.98]`)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()
    return f"{key}: {text}"


def _noted(line: str, note: str | None) -> str:
    return f"{line}  # {note}" if note else line


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _torch_version() -> str:
    import torch

    return torch.__version__


# ------------------------------------------------------------------------------------------------------ reading


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: `lr: 5e-4` is a number, not the text '5e-4' (YAML 1.1 wants a
    dot in the mantissa)."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def read(path: str | os.PathLike) -> dict:
    """TrainConfig's keyword arguments from the file at `path`: only the keys it sets (`model` as overrides of its
    preset), values equal to its preset's left out; one-line ConfigErrors for anything else."""
    raw = _load(Path(path))
    hints = {**typing.get_type_hints(TrainConfig), "data_dir": str | None, "out_dir": str | None}
    model_hints = typing.get_type_hints(ModelConfig)
    kwargs, model = {}, {}
    for key, value in raw.items():
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {key} must be a mapping of keys to values, got {_shown(value)}")
            for k, v in value.items():
                if k not in SECTIONS[key]:
                    raise _unknown(path, key, k)
                where = f"{key}.{k}"
                if key == "model":
                    model[k] = _typed(path, where, v, model_hints[k])
                else:
                    kwargs[k] = _typed(path, where, v, hints[k], _EXPECTED.get(k))
        elif key in TOP:
            kwargs[key] = _typed(path, key, raw[key], hints[key])
        else:
            raise _unknown(path, "", key)
    for key in DATA + ("out_dir",):
        if kwargs.get(key, "") is None:
            del kwargs[key]
    return _as_overrides(path, kwargs, model)


def _load(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file; check the path (nmt train --print-config > FILE "
                          "writes one)") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path} is a directory; pass a YAML file such as RUN_DIR/config.yaml") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte {exc.start}); pass a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror or exc}); fix the permissions") from None
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader: plain data only, never objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"--config {path} is not valid YAML: {what}{where}; fix it, or start from nmt train "
                          "--print-config") from None
    if not isinstance(raw, dict):
        got = "empty" if raw is None else f"{_shown(raw)}, not a mapping"
        raise ConfigError(f"--config {path} is {got}; it must map keys (preset, model:, recipe:, data:, machine:) "
                          "to values, as nmt train --print-config prints")
    return raw


def _as_overrides(path, kwargs: dict, model: dict) -> dict:
    """The values a preset would give anyway become its defaults: the model's fields equal to the preset's are
    dropped, and recipe values equal to its RECIPES entry become None."""
    name = kwargs.get("preset", TrainConfig.preset)
    if name not in PRESETS:
        raise ConfigError(f"{path}: unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    if kwargs.get("init_from") is None:  # from scratch: the file's model is the preset's with overrides
        base = PRESETS[name]
        model = {k: v for k, v in model.items() if getattr(base, k) != v}
        fixed = [k for k in model if k not in MODEL_OVERRIDES]
        if fixed:
            k = fixed[0]
            raise ConfigError(f"{path}: model.{k} {model[k]!r} is not preset {name}'s {getattr(base, k)!r}, and a "
                              f"run cannot change it (only {', '.join(MODEL_OVERRIDES)}); remove it")
    for key in PRESET_FILLED:
        if key in kwargs and kwargs[key] == preset_value(name, key, kwargs):
            kwargs[key] = None
    if model:
        kwargs["model"] = model
    return kwargs


def _typed(path, where: str, value, hint, expected: str | None = None):
    """`value` as the field's type, checked by pydantic in strict mode (an integer is a number, never text or a
    boolean; a list of two numbers is a tuple of two), or a ConfigError naming the key, the expected type and what
    the file gives."""
    try:  # (YAML has lists only: a tuple field takes one)
        return _adapter(hint).validate_python(tuple(value) if typing.get_origin(hint) is tuple and
                                              isinstance(value, list) else value, strict=True)
    except ValidationError:
        raise ConfigError(f"{path}: {where} must be {expected or _expected(hint)}, got {_shown(value)}") from None


_ADAPTERS: dict = {}


def _adapter(hint) -> TypeAdapter:
    if hint not in _ADAPTERS:
        _ADAPTERS[hint] = TypeAdapter(hint)
    return _ADAPTERS[hint]


def _expected(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in args)
    if origin is tuple:
        return f"a list of {len(args)} numbers"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "text", dict: "a mapping",
             type(None): "null"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    if isinstance(value, str):
        return f"{text} (text)"
    if isinstance(value, list):
        return f"{text} (a list)"
    return text


def _unknown(path, section: str, key) -> ConfigError:
    """An unknown key: where it belongs when it is another section's, else the closest known key (difflib)."""
    name = f"{section}.{key}" if section else str(key)
    layout = {"": (*TOP, *SECTIONS), **SECTIONS}
    if key in NOT_IN_FILE:
        hint = NOT_IN_FILE[key]
    elif any(key in keys for keys in layout.values()):
        home = next(s for s, keys in layout.items() if key in keys)
        hint = f"it belongs to {home}: write it as {home}.{key}" if home else "it is a top-level key"
    else:
        here = list(layout[section])
        close = difflib.get_close_matches(str(key), here, n=1)
        qualified = [f"{s}.{k}" if s else k for s, keys in layout.items() for k in keys]
        close = [f"{section}.{close[0]}" if section else close[0]] if close else \
            difflib.get_close_matches(name, qualified, n=1)
        hint = (f"did you mean {close[0]}?" if close else f"known here: {', '.join(here)}") + \
            " (nmt train --print-config prints every key)"
    return ConfigError(f"{path}: unknown key {name}; {hint}")
