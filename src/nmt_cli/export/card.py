"""The model card (README.md) of an export or a hub repository: metadata the hub reads (languages, licence,
library, pipeline), what the model is (its config), what it was trained on, how well it translates (BLEU with its
sacreBLEU signature, from `nmt score --json`, when given) and how to run it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli import __version__
from nmt_cli.checkpoints.format import Checkpoint
from nmt_cli.errors import ConfigError

UNKNOWN = "not recorded"


@dataclass
class CardInfo:
    """What a model card says beyond what the checkpoint holds."""

    license: str = "unknown"  # a hub licence identifier (apache-2.0, cc-by-4.0, ...) or "unknown"
    training_data: str | None = None  # e.g. "Multi30k en-de train (29,000 sentence pairs)"
    scores: dict[str, Any] | None = None  # the JSON of `nmt score --json`
    extra_tags: list[str] = field(default_factory=list)


def load_scores(path: str | os.PathLike) -> dict[str, Any]:
    """Read the output of `nmt score --json` (a ConfigError of one line when it is not that)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"cannot read --scores {path}: no such file; pass the file that `nmt score --json` "
                          "wrote") from None
    except OSError as exc:
        raise ConfigError(f"cannot read --scores {path}: {exc.strerror or exc}; pass the file that "
                          "`nmt score --json` wrote") from exc
    except ValueError as exc:
        raise ConfigError(f"cannot read --scores {path}: not JSON ({exc}); pass the output of `nmt score --json`"
                          ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("systems"), list) or not data["systems"] \
            or "signatures" not in data:
        raise ConfigError(f"{path} is not the output of `nmt score --json` (no systems/signatures); "
                          "write it with: nmt score -r REF --json < HYP > scores.json")
    return data


def num_parameters(ckpt: Checkpoint) -> int:
    """Parameters of the model (a tensor shared under several names counted once)."""
    seen, total = set(), 0
    for tensor in ckpt.model_state.values():
        key = (tensor.data_ptr(), tensor.numel())
        if key not in seen:
            seen.add(key)
            total += tensor.numel()
    return total


def score_lines(scores: dict[str, Any] | None) -> list[str]:
    """One bullet per metric of the first scored system, with its signature."""
    if not scores:
        return [f"- No evaluation was given at export time ({UNKNOWN}); `nmt score --json` output can be "
                "passed with `--scores`."]
    system = scores["systems"][0]
    refs = ", ".join(f"`{Path(r).name}`" for r in scores.get("references") or []) or "the reference"
    out = []
    for name, value in system.get("scores", {}).items():
        label = {"bleu": "BLEU", "chrf": "chrF", "chrf++": "chrF++", "ter": "TER", "tok-bleu": "tok-BLEU"}.get(
            name, name)
        signature = scores["signatures"].get(name, "")
        out.append(f"- {label} **{value['score']:.1f}** on {refs} (sacreBLEU signature `{signature}`)")
    return out


def model_card(ckpt: Checkpoint, info: CardInfo, *, title: str, library: str, usage: str,
               tags: list[str] | None = None) -> str:
    """The README.md text: YAML metadata, then description, training data, evaluation, config and `usage`."""
    c = ckpt.model_config
    src, tgt = ckpt.langs.get("src"), ckpt.langs.get("tgt")
    languages = [lang for lang in (src, tgt) if lang]
    meta = ["---"]
    if languages:
        meta += ["language:"] + [f"- {lang}" for lang in languages]
    meta += [f"license: {info.license}", f"library_name: {library}", "pipeline_tag: translation", "tags:"]
    meta += [f"- {t}" for t in ["translation", "nmt", *(tags or []), *info.extra_tags]]
    meta.append("---")
    pair = f"{src}→{tgt}" if src and tgt else "translation"
    norm = "pre-LN" if c.norm_first else "post-LN (as in the paper)"
    trained = ckpt.meta
    training = [f"- Data: {info.training_data or UNKNOWN}"]
    if "step" in trained:
        training.append(f"- Updates: {trained['step']}" + (f" (epoch {trained['epoch']})" if "epoch" in trained else ""))
    if trained.get("averaged_from"):
        training.append(f"- Weights: the average of {len(trained['averaged_from'])} checkpoints")
    for key in ("valid_bleu", "valid_nll", "valid_ppl"):
        if key in trained:
            training.append(f"- {key} at the last validation: {trained[key]:.3f}")
    config_rows = [
        ("architecture", f"Transformer encoder-decoder, {norm}, ReLU, sinusoidal positions"),
        ("d_model / d_ff / heads", f"{c.d_model} / {c.d_ff} / {c.n_heads}"),
        ("layers (encoder + decoder)", f"{c.encoder_layers} + {c.decoder_layers}"),
        ("vocabulary", f"{c.vocab_size} joint sentencepiece BPE pieces, "
                       f"{'one embedding matrix shared by source, target and output' if c.share_embeddings else 'separate embeddings'}"),
        ("max positions", str(c.max_positions)),
        ("parameters", f"{num_parameters(ckpt):,}"),
        ("preset", str(trained.get("preset", UNKNOWN))),
        ("nmt version", str(__version__)),
    ]
    body = [
        f"# {title}", "",
        f"A Transformer (\"Attention Is All You Need\") for {pair} translation, trained with nmt (the `nmt-cli` "
        "package).",
        "", "## Training", "", *training, "",
        "## Evaluation", "", *score_lines(info.scores), "",
        "## Model", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in config_rows], "",
        f"Licence: `{info.license}`.", "",
        usage.strip(), "",
    ]
    return "\n".join(meta + [""] + body).rstrip("\n") + "\n"
