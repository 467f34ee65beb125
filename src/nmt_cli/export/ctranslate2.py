"""nmt checkpoint -> CTranslate2 model directory, through CTranslate2's own spec API (`TransformerSpec`).

Every sublayer is mapped by one small helper (`_linear`, `_layer_norm`, `_attention`, `_ffn`), as CTranslate2's
converters do. nmt's fused projections are CTranslate2's layout already (self-attention [3D, D] q|k|v,
encoder-decoder attention [D, D] q and [2D, D] k|v). The positional table is nmt's own (interleaved sin/cos), so
positions need no translation. Post-LN and pre-LN (with the final norms) are both expressible; shared or separate
embeddings too.

The folder holds model.bin, config.json and shared_vocabulary.json (CTranslate2's), sentencepiece.model (the
checkpoint's tokenizer), README.md (model card and the Python lines that translate with it) and nmt_export.json
(where it came from), and vmap.txt where the checkpoint has a vocabulary shortlist (data/shortlist.py): CTranslate2's
vocabulary mapping (its converter's `--vocab_mapping`), so that `use_vmap=True` scores the candidates nmt translate
scores. The source EOS is added by CTranslate2 itself (`add_source_eos`), so callers pass plain sentencepiece
pieces.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.checkpoints.format import Checkpoint
from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_cli.errors import ConfigError
from nmt_cli.export import require
from nmt_cli.export.card import CardInfo, model_card
from nmt_cli.export.folder import atomic_folder
from nmt_cli.runtime import defaults

# CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES); None keeps float32.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
SPM_FILE = "sentencepiece.model"
PROVENANCE_FILE = "nmt_export.json"
SUPPORTED_CTRANSLATE2 = (4, 5)  # major versions whose TransformerSpec this converter was written against


def check_convertible(ckpt: Checkpoint) -> None:
    """Refuse, in one line, a checkpoint the spec cannot represent faithfully. Every ModelConfig nmt accepts maps
    onto TransformerSpec (post-/pre-LN, shared or separate embeddings, any layer norm epsilon); what remains is a
    damaged checkpoint whose embedding table and tokenizer disagree."""
    c = ckpt.model_config
    if c.vocab_size != ckpt.tokenizer_obj().vocab_size:
        raise ConfigError(f"the checkpoint's model has {c.vocab_size} embeddings but its tokenizer "
                          f"{ckpt.tokenizer_obj().vocab_size} pieces; it cannot be exported")


def build_spec(ckpt: Checkpoint):
    """The checkpoint as a validated `ctranslate2.specs.TransformerSpec` (float32 weights, vocabularies set)."""
    ct2 = require("ctranslate2", "exporting to CTranslate2")
    major = int(ct2.__version__.split(".")[0])
    if not SUPPORTED_CTRANSLATE2[0] <= major < SUPPORTED_CTRANSLATE2[1]:
        raise ConfigError(f"ctranslate2 {ct2.__version__} is not supported (4.x is); "
                          "install a supported one: pip install 'ctranslate2>=4.8,<5'")  # the export extra's range
    from ctranslate2.specs import common_spec, transformer_spec

    check_convertible(ckpt)
    c = ckpt.model_config
    model = ckpt.build_model("cpu").float()
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "swish": common_spec.Activation.SWISH}[c.activation]
    spec = transformer_spec.TransformerSpec.from_config((c.encoder_layers, c.decoder_layers), c.n_heads,
                                                        pre_norm=c.norm_first, activation=activation)
    with torch.no_grad():
        src_embed = model.embed.weight
        tgt_embed = getattr(model, "tgt_embed", model.embed).weight
        out_proj = model.out_proj.weight if hasattr(model, "out_proj") else model.embed.weight
        for side, table in ((spec.encoder, src_embed), (spec.decoder, tgt_embed)):
            embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
            embeddings.weight = _numpy(table)
            side.scale_embeddings = True  # sqrt(d_model), as nmt
            side.position_encodings.encodings = _numpy(model.positions)
        _linear(spec.decoder.projection, out_proj, model.output_bias)
        for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers, strict=True):
            _attention(layer_spec.self_attention, layer.self_attn)
            _layer_norm(layer_spec.self_attention.layer_norm, layer.sub1.norm)
            _ffn(layer_spec.ffn, layer.ffn, layer.sub2.norm)
        for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers, strict=True):
            _attention(layer_spec.self_attention, layer.self_attn)
            _layer_norm(layer_spec.self_attention.layer_norm, layer.sub1.norm)
            _attention(layer_spec.attention, layer.cross_attn)
            _layer_norm(layer_spec.attention.layer_norm, layer.sub2.norm)
            _ffn(layer_spec.ffn, layer.ffn, layer.sub3.norm)
        if c.norm_first:  # pre-LN: the final norm of each stack
            _layer_norm(spec.encoder.layer_norm, model.encoder_norm)
            _layer_norm(spec.decoder.layer_norm, model.decoder_norm)
    vocab = vocabulary(ckpt)
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = vocab[UNK_ID], vocab[BOS_ID], vocab[EOS_ID]
    spec.config.decoder_start_token = vocab[BOS_ID]  # nmt's decoder starts from BOS
    spec.config.add_source_eos = True  # nmt encodes a source as its pieces + EOS
    spec.config.layer_norm_epsilon = c.layer_norm_eps
    spec.validate()
    return spec


def vocabulary(ckpt: Checkpoint) -> list[str]:
    """The pieces by model id; id 0 (padding) is CTranslate2's padding token `<blank>`."""
    tok = ckpt.tokenizer_obj()
    vocab = [tok.piece(i) for i in range(tok.vocab_size)]
    vocab[PAD_ID] = "<blank>"
    return vocab


def _numpy(t: torch.Tensor):
    return t.detach().float().contiguous().numpy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    spec.weight = _numpy(weight)
    if bias is not None:
        spec.bias = _numpy(bias)


def _layer_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _attention(spec, attn) -> None:
    """nmt's fused projections map one to one: self [3D, D] (q|k|v); encoder-decoder [D, D] q, [2D, D] k|v."""
    if attn.self_attention:
        _linear(spec.linear[0], attn.qkv_proj.weight, attn.qkv_proj.bias)
    else:
        _linear(spec.linear[0], attn.q_proj.weight, attn.q_proj.bias)
        _linear(spec.linear[1], attn.kv_proj.weight, attn.kv_proj.bias)
    _linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)


def _ffn(spec, ffn, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear_0, ffn.fc1.weight, ffn.fc1.bias)
    _linear(spec.linear_1, ffn.fc2.weight, ffn.fc2.bias)
    _layer_norm(spec.layer_norm, norm)


def export(ckpt: Checkpoint, out_dir: str | os.PathLike, quantization: str | None = None,
           card: CardInfo | None = None, source: dict[str, Any] | None = None, replace: bool = False) -> Path:
    """Write the CTranslate2 model directory `out_dir` (atomically) -> its path.

    `quantization`: one of QUANTIZATIONS (the weights' type on disk; CTranslate2 converts at load time as asked
    by `compute_type`); None keeps float32. `source` (e.g. the checkpoint path and sha256) goes to nmt_export.json.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(f"unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}")
    spec = build_spec(ckpt)
    spec.optimize(quantization=quantization)
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, replace) as tmp, tempfile.TemporaryDirectory() as scratch:
        if ckpt.shortlist is not None:
            mapping = Path(scratch) / "vmap.txt"
            mapping.write_text(vocabulary_mapping(ckpt), encoding="utf-8")
            spec.register_vocabulary_mapping(str(mapping))  # copied into the folder by save
        spec.save(str(tmp))
        if ckpt.target_tokenizer is None:
            (tmp / SPM_FILE).write_bytes(ckpt.tokenizer)
        else:  # an imported (OPUS-MT) tokenizer: pieces of the source model in, of the target model out
            (tmp / "source.spm").write_bytes(ckpt.tokenizer)
            (tmp / "target.spm").write_bytes(ckpt.target_tokenizer)
        (tmp / "README.md").write_text(readme(ckpt, card or CardInfo(), out_dir.name, quantization),
                                       encoding="utf-8")
        provenance = {"format": "ctranslate2", "nmt_version": __version__, "quantization": quantization or "float32",
                      "source": source or {}, "model_config": ckpt.model_config.to_dict(), "langs": ckpt.langs}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return out_dir


def vocabulary_mapping(ckpt: Checkpoint, size: int = defaults.SHORTLIST_SIZE) -> str:
    """The checkpoint's shortlist as CTranslate2's vocabulary mapping: a line `source piece<TAB>target pieces` per
    source piece (the first `size` of its list, as nmt translate uses by default), and a line with an empty key for
    the pieces always allowed (the frequent ones and language tags; CTranslate2 adds UNK, BOS and EOS itself)."""
    from nmt_cli.data.shortlist import Shortlist

    vocab = vocabulary(ckpt)
    table = Shortlist.from_dict(ckpt.shortlist, len(vocab))
    tok = ckpt.tokenizer_obj()
    always = [int(i) for i in table.frequent] + [tok.piece_id(f">>{lang}<<") for lang in tok.languages]
    lines = ["\t" + " ".join(vocab[i] for i in always)]
    for s, row in enumerate(table.pieces[:, :size].tolist()):
        listed = [vocab[t] for t in row if t >= 0]
        if listed and s > EOS_ID:
            lines.append(vocab[s] + "\t" + " ".join(listed))
    return "\n".join(lines) + "\n"


def usage(folder: str) -> str:
    """The model card's usage section: three lines of Python, and the settings that match `nmt translate`."""
    return f"""## Use with CTranslate2

`pip install ctranslate2 sentencepiece`, then, from the directory that holds `{folder}/`:

```python
import ctranslate2, sentencepiece
sp, translator = sentencepiece.SentencePieceProcessor(model_file="{folder}/{SPM_FILE}"), ctranslate2.Translator("{folder}")
print(sp.decode(translator.translate_batch([sp.encode("A man is riding a bike.", out_type=str)], beam_size={defaults.BEAM}, length_penalty={defaults.LENPEN})[0].hypotheses[0]))
```

With the same beam and alpha, CTranslate2 gives the translations of `nmt translate --lenpen-form fairseq`: its
length penalty divides a hypothesis' score by length^alpha (nmt's `fairseq` form; nmt's default `gnmt` form,
((5 + length) / 6)^alpha, has no CTranslate2 equivalent and ranks a few percent of beams differently). Its
`max_decoding_length` defaults to 256 tokens where nmt allows source length + 50. The source end-of-sentence token is added by CTranslate2
(`add_source_eos`). `compute_type="int8"` (CPU) or `"int8_float16"` (GPU) trades a little accuracy for speed."""


def readme(ckpt: Checkpoint, card: CardInfo, folder: str, quantization: str | None) -> str:
    title = f"nmt {ckpt.langs.get('src', '?')}→{ckpt.langs.get('tgt', '?')} for CTranslate2"
    note = f"\n\nWeights stored as `{quantization}`." if quantization else ""
    text = usage(folder)
    if ckpt.target_tokenizer is not None:
        text = text.replace(
            f'sp, translator = sentencepiece.SentencePieceProcessor(model_file="{folder}/{SPM_FILE}"), ',
            f'src = sentencepiece.SentencePieceProcessor(model_file="{folder}/source.spm")\n'
            f'sp = sentencepiece.SentencePieceProcessor(model_file="{folder}/target.spm")\n'
            'translator = ').replace("[sp.encode(", "[src.encode(")
    return model_card(ckpt, card, title=title, library="ctranslate2", usage=text + note,
                      tags=["ctranslate2"])
