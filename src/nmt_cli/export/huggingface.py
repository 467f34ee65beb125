"""nmt checkpoint -> Hugging Face `transformers` MarianMTModel + MarianTokenizer, saved with `save_pretrained`.

Marian is nmt's default architecture: post-LN encoder-decoder, ReLU, embeddings scaled by sqrt(d_model), one
matrix shared by source, target and output projection, sinusoidal positions, no embedding layer norm. nmt's fused
projections are split (self-attention qkv [3D, D] -> q, k, v; encoder-decoder kv [2D, D] -> k, v).

Positions: nmt interleaves sin (even coordinates) and cos (odd), Marian lays out [sin half | cos half], and
`save_pretrained` does not store the table (Marian rebuilds it when loading). So the export permutes the d_model
coordinates instead: Marian coordinate m is nmt coordinate PERM[m] = (0, 2, 4, ..., 1, 3, 5, ...). Permuting the
residual stream's coordinates in every weight that reads it (embeddings, q/k/v, fc1: columns), writes it
(attention output, fc2: rows and biases) or normalizes it (layer norms) leaves the function unchanged (layer norm
and the output dot product are invariant to a common permutation), and under it nmt's table IS Marian's table. The
saved model is therefore exact after `from_pretrained`, with nothing to patch at load time.

Imported OPUS-MT models (marian.py) go back out in nmt's vocabulary layout (pad 0, unk 1, bos 2, eos 3) with their
source and target sentencepiece models, activation and final_logits_bias.

Refused (one line each): pre-LN models (Marian is post-LN; CTranslate2 can take them), separate embeddings.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.checkpoints.format import Checkpoint
from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.errors import ConfigError
from nmt_cli.export import require
from nmt_cli.export.card import CardInfo, model_card
from nmt_cli.export.folder import atomic_folder
from nmt_cli.runtime import defaults

PROVENANCE_FILE = "nmt_export.json"
SUPPORTED_TRANSFORMERS = ((4, 57), (6, 0))  # [lowest, first unsupported]: tested with 4.57.6 and 5.23.0


def check_convertible(ckpt: Checkpoint) -> None:
    """Refuse, in one line, what a MarianMTModel cannot represent exactly."""
    c = ckpt.model_config
    if c.norm_first:
        raise ConfigError("this checkpoint is pre-LN (norm_first); Hugging Face's MarianMTModel is post-LN and "
                          "cannot represent it: export it with `nmt export ctranslate2` instead")
    if not c.share_embeddings:
        raise ConfigError("this checkpoint has separate source/target embeddings; the Hugging Face export supports "
                          "one shared matrix only: export it with `nmt export ctranslate2` instead")
    if c.vocab_size != ckpt.tokenizer_obj().vocab_size:
        raise ConfigError(f"the checkpoint's model has {c.vocab_size} embeddings but its tokenizer "
                          f"{ckpt.tokenizer_obj().vocab_size} pieces; it cannot be exported")


def _transformers():
    tf = require("transformers", "exporting to Hugging Face")
    version = tuple(int(x) for x in re.findall(r"\d+", tf.__version__)[:2])
    if not SUPPORTED_TRANSFORMERS[0] <= version < SUPPORTED_TRANSFORMERS[1]:
        raise ConfigError(f"transformers {tf.__version__} is not supported (4.57 to 5.x are); "
                          "install a supported one: pip install 'transformers>=4.57,<6'")
    return tf


def marian_config(ckpt: Checkpoint):
    """A MarianConfig with the checkpoint's shapes, special ids and dropout rates."""
    from transformers import MarianConfig

    c = ckpt.model_config
    return MarianConfig(
        vocab_size=c.vocab_size, decoder_vocab_size=c.vocab_size, d_model=c.d_model,
        encoder_layers=c.encoder_layers, decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, activation_function=c.activation,
        max_position_embeddings=c.max_positions, scale_embedding=True,
        dropout=c.dropout, attention_dropout=c.attention_dropout, activation_dropout=c.activation_dropout,
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,  # generation settings live in generation_config() (transformers 4.x warns)
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )


def generation_config(ckpt: Checkpoint):
    """generate()'s defaults, saved with the model: nmt's beam 4 and alpha 0.6 (in HF's length penalty form,
    score / len^alpha, i.e. `nmt translate --lenpen-form fairseq`), fairseq's stopping rule (nmt's default), BOS and
    PAD never generated, EOS forced at the maximum length."""
    from transformers import GenerationConfig

    return GenerationConfig(
        num_beams=defaults.BEAM, length_penalty=defaults.LENPEN, early_stopping=True, max_length=ckpt.model_config.max_positions,
        decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID, suppress_tokens=[PAD_ID, BOS_ID],
    )


def permutation(d_model: int) -> torch.Tensor:
    """PERM[m] = the nmt coordinate of Marian coordinate m: even coordinates (sin) first, then odd (cos)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state_dict(nmt: dict[str, torch.Tensor], d_model: int) -> dict[str, torch.Tensor]:
    """nmt state dict -> MarianMTModel weights (without the positional tables, which Marian builds itself).

    Every tensor touching the residual stream is permuted by `permutation(d_model)`: `reads` permutes columns
    (input features), `writes` rows and biases (output features), `norm` both layer norm vectors.
    """
    perm = permutation(d_model)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return nmt[name].float()

    def reads(dst: str, src: str, rows: slice = slice(None)) -> None:  # a linear reading the residual stream
        out[f"{dst}.weight"] = take(f"{src}.weight")[rows][:, perm]
        out[f"{dst}.bias"] = take(f"{src}.bias")[rows]

    def writes(dst: str, src: str) -> None:  # a linear writing the residual stream
        out[f"{dst}.weight"] = take(f"{src}.weight")[perm]
        out[f"{dst}.bias"] = take(f"{src}.bias")[perm]

    def norm(dst: str, src: str) -> None:
        out[f"{dst}.weight"] = take(f"{src}.weight")[perm]
        out[f"{dst}.bias"] = take(f"{src}.bias")[perm]

    q, k, v = slice(0, d_model), slice(d_model, 2 * d_model), slice(2 * d_model, 3 * d_model)
    for side, prefix in (("encoder", "encoder_layers"), ("decoder", "decoder_layers")):
        n_layers = len({key.split(".")[1] for key in nmt if key.startswith(prefix + ".")})
        for i in range(n_layers):
            theirs, mine = f"model.{side}.layers.{i}", f"{prefix}.{i}"
            for name, rows in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                reads(f"{theirs}.self_attn.{name}", f"{mine}.self_attn.qkv_proj", rows)
            writes(f"{theirs}.self_attn.out_proj", f"{mine}.self_attn.out_proj")
            norm(f"{theirs}.self_attn_layer_norm", f"{mine}.sub1.norm")
            if side == "decoder":
                reads(f"{theirs}.encoder_attn.q_proj", f"{mine}.cross_attn.q_proj")
                reads(f"{theirs}.encoder_attn.k_proj", f"{mine}.cross_attn.kv_proj", q)
                reads(f"{theirs}.encoder_attn.v_proj", f"{mine}.cross_attn.kv_proj", k)
                writes(f"{theirs}.encoder_attn.out_proj", f"{mine}.cross_attn.out_proj")
                norm(f"{theirs}.encoder_attn_layer_norm", f"{mine}.sub2.norm")
            reads(f"{theirs}.fc1", f"{mine}.ffn.fc1")
            writes(f"{theirs}.fc2", f"{mine}.ffn.fc2")
            norm(f"{theirs}.final_layer_norm", f"{mine}.sub3.norm" if side == "decoder" else f"{mine}.sub2.norm")
    embed = take("embed.weight")[:, perm]
    for key in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight"):
        out[key] = embed
    bias = nmt.get("output_bias")
    if bias is not None:
        used.add("output_bias")
    out["final_logits_bias"] = (torch.zeros(embed.size(0)) if bias is None else bias.float()).reshape(1, -1)
    unused = set(nmt) - used
    if unused:
        raise ConfigError(f"the Hugging Face export does not know the checkpoint weights {sorted(unused)[:3]}; "
                          "this checkpoint was written by another nmt version")
    return out


def to_marian(ckpt: Checkpoint):
    """The checkpoint as an equivalent MarianMTModel in memory (fp32, eval mode)."""
    _transformers()
    from transformers import MarianMTModel

    check_convertible(ckpt)
    hf = MarianMTModel(marian_config(ckpt)).eval()
    weights = marian_state_dict(ckpt.model_state, ckpt.model_config.d_model)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("embed_positions.weight")]
    if missing or unexpected:
        raise ConfigError(f"the Hugging Face export does not match this transformers version's MarianMTModel "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); install transformers 4.57 to 5.x")
    hf.generation_config = generation_config(ckpt)
    return hf


def write_tokenizer(ckpt: Checkpoint, folder: Path):
    """MarianTokenizer files in `folder`: source.spm = target.spm (the joint BPE model), vocab.json (piece -> id,
    the ids nmt uses), tokenizer_config.json. An imported tokenizer keeps its two sentencepiece models. -> the
    tokenizer."""
    from transformers import MarianTokenizer

    tok = ckpt.tokenizer_obj()
    (folder / "source.spm").write_bytes(tok.model_bytes)
    (folder / "target.spm").write_bytes(tok.target_bytes or tok.model_bytes)
    vocab = {tok.piece(i): i for i in range(tok.vocab_size)}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    tokenizer = MarianTokenizer(
        source_spm=str(folder / "source.spm"), target_spm=str(folder / "target.spm"), vocab=str(folder / "vocab.json"),
        source_lang=ckpt.langs.get("src"), target_lang=ckpt.langs.get("tgt"), unk_token="<unk>", eos_token="</s>",
        pad_token="<pad>", bos_token="<s>", model_max_length=ckpt.model_config.max_positions - 1,
    )
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def export(ckpt: Checkpoint, out_dir: str | os.PathLike, card: CardInfo | None = None,
           source: dict[str, Any] | None = None, replace: bool = False) -> Path:
    """Write the Hugging Face model folder `out_dir` (atomically) -> its path."""
    _transformers()
    check_convertible(ckpt)
    out_dir = Path(out_dir)
    hf = to_marian(ckpt)
    with atomic_folder(out_dir, replace) as tmp:
        hf.save_pretrained(str(tmp))
        write_tokenizer(ckpt, tmp)
        (tmp / "README.md").write_text(readme(ckpt, card or CardInfo(), out_dir.name), encoding="utf-8")
        provenance = {"format": "huggingface", "nmt_version": __version__, "source": source or {},
                      "model_config": ckpt.model_config.to_dict(), "langs": ckpt.langs,
                      "positions": "d_model coordinates permuted (even, then odd) to Marian's sin|cos layout"}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return out_dir


def usage(folder: str) -> str:
    return f"""## Use with transformers

`pip install transformers sentencepiece torch`, then, from the directory that holds `{folder}/`:

```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer, model = MarianTokenizer.from_pretrained("{folder}"), MarianMTModel.from_pretrained("{folder}")
batch = tokenizer(["A man is riding a bike."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch, num_beams={defaults.BEAM}), skip_special_tokens=True))
```

With transformers 4.x the `translation` pipeline works too (transformers 5 removed that pipeline):

```python
from transformers import pipeline
print(pipeline("translation", model="{folder}")("A man is riding a bike.")[0]["translation_text"])
```

The saved generation settings are beam 4, length penalty 0.6 in Hugging Face's form (score / length^0.6, what
`nmt translate --lenpen-form fairseq` uses; nmt's default is the GNMT form), fairseq's stopping rule (nmt's
default) and a maximum length of {{max_positions}} tokens where nmt allows source length + 50. Greedy search
(`num_beams=1`) gives nmt's greedy output token for token."""


def readme(ckpt: Checkpoint, card: CardInfo, folder: str) -> str:
    title = f"nmt {ckpt.langs.get('src', '?')}→{ckpt.langs.get('tgt', '?')} (MarianMTModel)"
    text = usage(folder).replace("{max_positions}", str(ckpt.model_config.max_positions))
    return model_card(ckpt, card, title=title, library="transformers", usage=text, tags=["marian"])
