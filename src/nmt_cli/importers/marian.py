"""A MarianMT folder (OPUS-MT's format in `transformers`) -> an nmt checkpoint, exactly, or refused in one line.

In the style of CTranslate2's converters: `check_config` is the whitelist (anything nmt cannot represent exactly is
refused up front, naming the field and its value), then one helper per sublayer copies weights.

What maps onto what:
- Weights: q/k/v projections are fused into nmt's qkv (self-attention) and kv (encoder-decoder) projections;
  swish/gelu/relu -> ModelConfig.activation; final_logits_bias -> ModelConfig.output_bias.
- Positions: Marian lays out its sinusoids as [sin half | cos half], nmt interleaves them (sin at even coordinates,
  cos at odd). The d_model coordinates of every weight touching the residual stream are permuted (the inverse of
  export/huggingface.py's permutation), which leaves the function unchanged; under it Marian's table IS nmt's.
- Vocabulary: nmt's ids are pad 0, unk 1, bos 2, eos 3, then Marian's other ids in their order. Marian starts
  decoding with its pad token, so nmt's BOS gets a copy of that embedding row (the vocabulary grows by one when the
  start token is pad). Both pad and BOS are never generated, as Marian's generation config bans pad.
- Tokenizer: source.spm and target.spm cut text into pieces, vocab.json numbers them (data/tokenizer.py's imported
  kind); `>>xx<<` language codes of multilingual models stay one piece.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from nmt_cli.checkpoints.format import Checkpoint
from nmt_cli.checkpoints.integrity import check_archive
from nmt_cli.config import BOS_ID, ModelConfig
from nmt_cli.errors import CheckpointError, ConfigError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
FILES = ("config.json", "generation_config.json", "tokenizer_config.json", *TOKENIZER_FILES, *WEIGHT_FILES)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# config.json fields of older MarianConfigs (BART's options) and the only value nmt can represent
FIXED = {"normalize_before": False, "normalize_embedding": False, "static_position_embeddings": True,
         "add_final_layer_norm": False, "scale_embedding": True, "add_bias_logits": False, "layernorm_embedding": False}


def is_marian(folder: str | Path) -> bool:
    """Whether `folder` holds a MarianMT model (config.json with model_type marian)."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "marian"
    except (OSError, ValueError):
        return False


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); re-download the model") from exc


def check_config(hf: dict, tokenizer_config: dict) -> None:
    """Refuse, in one line naming the field and its value, what nmt cannot represent exactly."""
    def refuse(name: str, value, why: str) -> None:
        raise ConfigError(f"MarianMT config {name}={value!r}: {why}; nmt cannot import this model (CTranslate2's "
                          "ct2-transformers-converter may)")

    if hf.get("model_type") != "marian":
        refuse("model_type", hf.get("model_type"), "only MarianMT models (model_type marian) are imported")
    act = hf.get("activation_function", "swish")
    if act not in ACTIVATIONS:
        refuse("activation_function", act, f"nmt has {', '.join(sorted(ACTIVATIONS))}")
    for name, value in FIXED.items():
        if name in hf and bool(hf[name]) != value:
            refuse(name, hf[name], f"nmt's Transformer has {name}={value}")
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(enc) != hf.get(dec):
            refuse(dec, hf.get(dec), f"differs from {enc}={hf.get(enc)} and nmt has one value for both")
    if hf.get("decoder_vocab_size") not in (None, hf.get("vocab_size")):
        refuse("decoder_vocab_size", hf["decoder_vocab_size"], "a separate target vocabulary is not supported yet")
    if not hf.get("share_encoder_decoder_embeddings", True):
        refuse("share_encoder_decoder_embeddings", False, "separate source and target vocabularies are not "
               "supported yet")
    if tokenizer_config.get("separate_vocabs"):
        refuse("separate_vocabs", True, "separate source and target vocabularies are not supported yet")
    if hf.get("d_model", 0) % max(1, hf.get("encoder_attention_heads", 1)) or hf.get("d_model", 0) % 2:
        refuse("d_model", hf.get("d_model"), "must be even and divisible by the number of heads")


def model_config(hf: dict, vocab_size: int, final_logits_bias: bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size, d_model=hf["d_model"], d_ff=hf["encoder_ffn_dim"],
        n_heads=hf["encoder_attention_heads"], encoder_layers=hf["encoder_layers"],
        decoder_layers=hf["decoder_layers"], dropout=float(hf.get("dropout", 0.1)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        activation_dropout=float(hf.get("activation_dropout", 0.0)),
        max_positions=hf.get("max_position_embeddings", 512), norm_first=False,
        share_embeddings=bool(hf.get("tie_word_embeddings", True)), activation=ACTIVATIONS[hf.get(
            "activation_function", "swish")], output_bias=final_logits_bias,
    ).validate()


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's weights: model.safetensors (with the safetensors package) or pytorch_model.bin (read with
    torch.load(weights_only=True): a downloaded file never runs code; its CRC-32s compared first)."""
    if (folder / WEIGHT_FILES[0]).is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / WEIGHT_FILES[0]))
    if (folder / WEIGHT_FILES[1]).is_file():
        path = folder / WEIGHT_FILES[1]
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":  # torch.save's zip archive (not the legacy pickle): its CRC-32s
                check_archive(path, "re-download the model")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 (torch raises many kinds on damaged or unsafe files)
            raise CheckpointError(f"{folder / WEIGHT_FILES[1]}: cannot be read safely ({type(exc).__name__}); "
                                  "re-download the model") from exc
    raise CheckpointError(f"{folder} has no {' or '.join(WEIGHT_FILES)}; it is not a complete MarianMT model")


def vocabulary(marian_vocab: dict[str, int], size: int, pad: int, eos: int, start: int) -> tuple[list[int], list[str]]:
    """nmt id -> Marian id (`order`) and nmt id -> piece, with nmt's special ids first."""
    pieces = {i: p for p, i in marian_vocab.items()}
    if "<unk>" not in marian_vocab:
        raise CheckpointError("the MarianMT vocab.json has no <unk>; it is not a MarianTokenizer vocabulary")
    unk = marian_vocab["<unk>"]
    if len({pad, unk, eos}) < 3:
        raise ConfigError(f"MarianMT config: pad {pad}, unk {unk} and eos {eos} must be different ids")
    order = [pad, unk, start, eos]
    order += [i for i in range(size) if i not in (pad, unk, start, eos)]
    names = [pieces.get(i, f"<unused:{i}>") for i in order]
    if start == pad:  # a new token: nmt's BOS, embedded as Marian's pad
        names[BOS_ID] = next(n for n in ("<s>", "<bos>", "<nmt:bos>") if n not in marian_vocab)
    return order, names


class _Weights:
    """Copy helpers: every tensor touching the residual stream has its d_model coordinates permuted."""

    def __init__(self, hf: dict[str, torch.Tensor], d_model: int):
        self.hf, self.used = hf, set()
        perm = torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])  # export/huggingface.py's
        self.inv = torch.argsort(perm)  # nmt coordinate j = Marian coordinate inv[j]
        self.out: dict[str, torch.Tensor] = {}

    def take(self, name: str) -> torch.Tensor:
        if name not in self.hf:
            raise CheckpointError(f"the MarianMT weights have no {name}; the model is incomplete or not MarianMT")
        self.used.add(name)
        return self.hf[name].float()

    def reads(self, dst: str, *srcs: str) -> None:  # linears reading the residual stream, fused along rows
        self.out[f"{dst}.weight"] = torch.cat([self.take(f"{s}.weight")[:, self.inv] for s in srcs])
        self.out[f"{dst}.bias"] = torch.cat([self.take(f"{s}.bias") for s in srcs])

    def writes(self, dst: str, src: str) -> None:  # a linear writing the residual stream
        self.out[f"{dst}.weight"] = self.take(f"{src}.weight")[self.inv]
        self.out[f"{dst}.bias"] = self.take(f"{src}.bias")[self.inv]

    def norm(self, dst: str, src: str) -> None:
        self.out[f"{dst}.weight"] = self.take(f"{src}.weight")[self.inv]
        self.out[f"{dst}.bias"] = self.take(f"{src}.bias")[self.inv]


def _self_attention(w: _Weights, mine: str, theirs: str) -> None:
    w.reads(f"{mine}.self_attn.qkv_proj", *(f"{theirs}.self_attn.{p}_proj" for p in "qkv"))
    w.writes(f"{mine}.self_attn.out_proj", f"{theirs}.self_attn.out_proj")
    w.norm(f"{mine}.sub1.norm", f"{theirs}.self_attn_layer_norm")


def _cross_attention(w: _Weights, mine: str, theirs: str) -> None:
    w.reads(f"{mine}.cross_attn.q_proj", f"{theirs}.encoder_attn.q_proj")
    w.reads(f"{mine}.cross_attn.kv_proj", f"{theirs}.encoder_attn.k_proj", f"{theirs}.encoder_attn.v_proj")
    w.writes(f"{mine}.cross_attn.out_proj", f"{theirs}.encoder_attn.out_proj")
    w.norm(f"{mine}.sub2.norm", f"{theirs}.encoder_attn_layer_norm")


def _feed_forward(w: _Weights, mine: str, theirs: str, norm: str) -> None:
    w.reads(f"{mine}.ffn.fc1", f"{theirs}.fc1")
    w.writes(f"{mine}.ffn.fc2", f"{theirs}.fc2")
    w.norm(f"{mine}.{norm}.norm", f"{theirs}.final_layer_norm")


def _embeddings(w: _Weights, order: list[int], tied: bool) -> None:
    """The matrices the encoder and decoder read (save_pretrained may store a tied one only as model.shared)."""
    rows = torch.tensor(order)

    def matrix(name: str) -> str:
        return name if name in w.hf else "model.shared.weight"

    w.out["embed.weight"] = w.take(matrix("model.encoder.embed_tokens.weight"))[rows][:, w.inv]
    if tied:
        w.used.update({"model.shared.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"} & set(w.hf))
    else:
        w.out["tgt_embed.weight"] = w.take(matrix("model.decoder.embed_tokens.weight"))[rows][:, w.inv]
        w.out["out_proj.weight"] = w.take("lm_head.weight")[rows][:, w.inv]
        w.used.update({"model.shared.weight"} & set(w.hf))
    w.used.update(k for k in w.hf if k.endswith("embed_positions.weight"))  # the sinusoid table, rebuilt


def convert(folder: str | Path) -> Checkpoint:
    """The MarianMT model in `folder` as an nmt checkpoint (fp32 weights, no training state)."""
    folder = Path(folder)
    hf = _read_json(folder / "config.json")
    if not hf:
        raise CheckpointError(f"{folder} has no config.json; it is not a MarianMT model folder")
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    check_config(hf, tokenizer_config)
    generation = _read_json(folder / "generation_config.json")
    missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder} lacks the MarianTokenizer files {missing}; download the whole repository")
    marian_vocab = _read_json(folder / "vocab.json")
    weights = load_weights(folder)
    size = hf["vocab_size"]
    if "model.shared.weight" not in weights and "model.encoder.embed_tokens.weight" not in weights:
        raise CheckpointError(f"{folder}: the weights have no embedding matrix (model.shared.weight)")
    pad = hf.get("pad_token_id", generation.get("pad_token_id"))
    eos = hf.get("eos_token_id", generation.get("eos_token_id"))
    start = hf.get("decoder_start_token_id", generation.get("decoder_start_token_id", pad))
    if isinstance(eos, list):
        eos = eos[0]
    order, pieces = vocabulary(marian_vocab, size, pad, eos, start)
    bias = weights.get("final_logits_bias")
    has_bias = bias is not None and bool(bias.abs().max() > 0)
    config = model_config(hf, len(order), has_bias)

    w = _Weights(weights, config.d_model)
    _embeddings(w, order, config.share_embeddings)
    for i in range(config.encoder_layers):
        mine, theirs = f"encoder_layers.{i}", f"model.encoder.layers.{i}"
        _self_attention(w, mine, theirs)
        _feed_forward(w, mine, theirs, "sub2")
    for i in range(config.decoder_layers):
        mine, theirs = f"decoder_layers.{i}", f"model.decoder.layers.{i}"
        _self_attention(w, mine, theirs)
        _cross_attention(w, mine, theirs)
        _feed_forward(w, mine, theirs, "sub3")
    if bias is not None:
        w.used.add("final_logits_bias")
        if has_bias:
            w.out["output_bias"] = bias.float().reshape(-1)[torch.tensor(order)]
    unused = sorted(set(weights) - w.used)
    if unused:
        raise ConfigError(f"the MarianMT weights hold {unused[:3]}, which nmt's Transformer has no place for; "
                          "it cannot be imported exactly")
    langs = _langs(folder, tokenizer_config)
    meta = {"imported_from": {"format": "marian", "source": str(folder), "marian_ids": {
        "pad": pad, "eos": eos, "decoder_start": start}}}
    source, target = (folder / "source.spm").read_bytes(), (folder / "target.spm").read_bytes()
    if source == target and _joint(source, pieces):  # nmt's own tokenizer, exported (export/huggingface.py)
        ckpt = Checkpoint(config, w.out, source, langs, None, meta)
    else:
        ckpt = Checkpoint(config, w.out, source, langs, None, meta, target, pieces)
    ckpt.build_model()  # every weight in place (a CheckpointError otherwise)
    return ckpt


def _joint(model: bytes, pieces: list[str]) -> bool:
    """Whether `pieces` are exactly the ids of the sentencepiece `model` with nmt's special ids (one joint model)."""
    from nmt_cli.data.tokenizer import Tokenizer
    from nmt_cli.errors import DataError

    try:
        sp = Tokenizer(model).sp
    except DataError:
        return False
    return sp.get_piece_size() == len(pieces) and all(
        sp.id_to_piece(i) == p for i, p in enumerate(pieces) if i > 3)


def _langs(folder: Path, tokenizer_config: dict) -> dict[str, str]:
    src, tgt = tokenizer_config.get("source_lang"), tokenizer_config.get("target_lang")
    if not (src and tgt):
        found = re.search(r"opus-mt-([a-z]+)-([a-z]+)", str(folder))
        src, tgt = found.groups() if found else ("src", "tgt")
    return {"src": str(src), "tgt": str(tgt)}


__all__ = ["convert", "is_marian", "check_config", "FILES"]
