"""Model configuration: one dataclass, the paper's presets, validation and overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nmt_cli.errors import ConfigError

# Special token ids, fixed for every tokenizer nmt trains (see data/tokenizer.py).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
ACTIVATIONS = ("relu", "gelu", "swish")  # gelu: the exact (erf) form; swish: x * sigmoid(x), also called SiLU


@dataclass
class ModelConfig:
    """Hyperparameters of the Transformer (Vaswani et al., 2017). Paper names are kept."""

    vocab_size: int = 37000  # shared source/target vocabulary (joint BPE)
    d_model: int = 512  # width of embeddings and residual stream
    d_ff: int = 2048  # inner width of the position-wise feed-forward network
    n_heads: int = 8  # h: attention heads; d_k = d_v = d_model / h
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1  # on embeddings+positions and on every sublayer output (P_drop)
    attention_dropout: float = 0.0  # on attention weights (not in the paper; fairseq's option)
    activation_dropout: float = 0.0  # after the ReLU of the feed-forward network (not in the paper)
    max_positions: int = 1024  # longest sequence (tokens incl. BOS/EOS) the model accepts
    norm_first: bool = False  # False: post-LN as in the paper, LayerNorm(x + Sublayer(x)); True: pre-LN
    share_embeddings: bool = True  # source emb = target emb = output projection (one matrix)
    pad_id: int = PAD_ID
    layer_norm_eps: float = 1e-5
    activation: str = "relu"  # the feed-forward network's: relu (the paper), gelu, swish (OPUS-MT's)
    output_bias: bool = False  # a fixed bias added to the output logits (MarianMT's final_logits_bias)

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; pick values that divide")
        for name in ("vocab_size", "d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "max_positions"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation {self.activation!r} is not one nmt has; choose one of: {', '.join(ACTIVATIONS)}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown model config fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data).validate()


PRESETS: dict[str, ModelConfig] = {
    # For tests and the CPU demo: trains in minutes on 2 cores.
    "tiny": ModelConfig(d_model=128, d_ff=512, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.1),
    # Table 3 of the paper, "base": ~63M parameters with a 37k shared vocabulary.
    "base": ModelConfig(d_model=512, d_ff=2048, n_heads=8, encoder_layers=6, decoder_layers=6, dropout=0.1),
    # "big": ~213M parameters; P_drop 0.3 for en-de (0.1 for en-fr).
    "big": ModelConfig(d_model=1024, d_ff=4096, n_heads=16, encoder_layers=6, decoder_layers=6, dropout=0.3),
}


def preset(name: str, **overrides) -> ModelConfig:
    """Return a copy of preset `name` with `overrides` applied (None values are ignored)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    bad = [k for k in overrides if k not in known]
    if bad:
        raise ConfigError(f"unknown model option(s) {bad}; known: {sorted(known)}")
    clean = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PRESETS[name], **clean).validate()


__all__ = ["ModelConfig", "PRESETS", "preset", "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "ACTIVATIONS"]
