"""The shared BERT-family encoder.

One transformer encoder serves every objective, so that a difference in downstream results can
be blamed on the objective and nothing else. It reads top to bottom:

    EncoderConfig  validated shapes (BERT, pre-LN, ALBERT factorisation + sharing, ELECTRA sizes)
    Embeddings     token + learned position + segment embeddings -> LayerNorm -> dropout
    SelfAttention  (attention.py) fused QKV projection, scaled dot-product attention with a padding
                   mask; every position queries, or only the rows a masked LM scores
    Layer          attention + GELU feed-forward, each with a residual and LayerNorm (post or pre)
    Encoder        embeddings -> (projection) -> layers -> (final LN) -> hidden states, pooled [CLS];
                   with ``rows=``, the last layer computes only the rows a masked LM scores

There is no loss and no ``labels=`` argument here: heads and losses belong to the objectives.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.config import ConfigError
from pretrainlab.model.attention import SelfAttention, gather_rows
from pretrainlab.model.dropout import Dropout
from pretrainlab.model.fastpath import eager_cpu


@dataclass
class EncoderConfig:
    """Shape of the encoder. Every field changes results, so every field names the run.

    ``embedding_size`` different from ``hidden_size`` factorises the embeddings (ALBERT, ELECTRA):
    tokens are embedded in a small space and projected to the hidden size once. ``share_layers`` makes all
    layers one set of parameters (ALBERT's cross-layer sharing).
    """

    vocab_size: int
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = None  # type: ignore[assignment]  # None: 4 * hidden_size (__post_init__)
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    embedding_size: int = None  # type: ignore[assignment]  # None: hidden_size (no factorisation)
    share_layers: bool = False
    pre_layer_norm: bool = False  # post-LN is BERT's; pre-LN trains more stably when deep
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    add_pooler: bool = True
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
            "embedding_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}.")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}: "
                f"each head gets hidden_size / num_heads dimensions. Choose num_heads among "
                f"{[h for h in range(1, min(self.hidden_size, 64) + 1) if self.hidden_size % h == 0]}."
            )
        for name in ("hidden_dropout", "attention_dropout"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {p}.")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EncoderConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def scaled(self, width: float) -> EncoderConfig:
        """Same depth and embeddings at ``width`` x the hidden size: ELECTRA's generator.

        As in the official implementation: hidden = round(width * H), one head per 64 dimensions,
        feed-forward 4 x hidden, no pooler.
        """
        hidden = max(1, int(round(self.hidden_size * width)))
        heads = max(1, hidden // 64)
        while hidden % heads:
            heads -= 1
        return EncoderConfig(
            **{
                **self.to_dict(),
                "hidden_size": hidden,
                "num_heads": heads,
                "intermediate_size": 4 * hidden,
                "add_pooler": False,
            }
        )


class EncoderOutput(NamedTuple):
    hidden_states: torch.Tensor  # (batch, seq, hidden)
    pooled: torch.Tensor | None  # (batch, hidden): tanh(dense([CLS])), when the config has a pooler
    layers: tuple[torch.Tensor, ...] | None = None  # with all_layers: the embeddings' output, then each layer's


class Embeddings(nn.Module):
    """Word + position + segment embeddings, summed, normalised. Output width: embedding_size."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.embedding_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.embedding_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.embedding_size)
        self.norm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[:seq_len]
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class Layer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.pre_ln = cfg.pre_layer_norm
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_out(F.gelu(self.ffn_in(x)))  # exact (erf) GELU, as BERT

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(batch, seq, hidden) -> the same. With ``rows`` ((batch, slots) positions in each sequence)
        every position is still attended to, but only those query, and only they go through the
        feed-forward: (batch, slots, hidden)."""
        residual = x if rows is None else gather_rows(x, rows)
        if self.pre_ln:
            x = residual + self.dropout(self.attention(self.attention_norm(x), attn_mask, rows))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attention_norm(residual + self.dropout(self.attention(x, attn_mask, rows)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class Encoder(nn.Module):
    """The shared encoder.

    ``own_embeddings=False`` builds the layers only; ``forward`` then takes another encoder's
    ``embeddings`` (ELECTRA's generator shares the discriminator's, which are saved once, there).
    """

    def __init__(self, cfg: EncoderConfig, own_embeddings: bool = True):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg) if own_embeddings else None
        # Factorised (or borrowed, differently sized) embeddings are projected to the hidden size once.
        self.embedding_projection = (
            nn.Linear(cfg.embedding_size, cfg.hidden_size) if cfg.embedding_size != cfg.hidden_size else None
        )
        n_distinct = 1 if cfg.share_layers else cfg.num_layers
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(n_distinct))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_layer_norm else None
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size) if cfg.add_pooler else None
        self.apply(self._init_weights)

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The token embedding table, which the masked-LM heads are tied to."""
        if self.embeddings is None:
            raise AttributeError(
                "this encoder borrows its embeddings (an ELECTRA generator): it has no table of its own"
            )
        return self.embeddings.word_embeddings

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        embeddings: Embeddings | None = None,
        rows: torch.Tensor | None = None,
        all_layers: bool = False,
    ) -> EncoderOutput:
        """``attention_mask``: 1/True for real tokens, 0/False for padding; None when nothing is padded.
        ``embeddings``: another encoder's embeddings, for an encoder built without its own.
        ``rows``: (batch, slots) positions in each sequence, the only ones whose output is wanted (the
        masked positions of a masked LM; unused slots may repeat a position). Only those query in
        the last layer and go through its output projection and feed-forward, and ``hidden_states``
        is (batch, slots, hidden); the pooled [CLS] vector is unaffected. Every layer still attends
        over all positions, so the rows are exactly what the full forward would give (up to dropout
        draws). Their shape comes from the batch, so nothing here waits for the device.
        ``all_layers``: also return every layer's output (``layers``: the embeddings, projected to
        the hidden size, then each layer; the last is ``hidden_states``), for feature extraction."""
        b, t = input_ids.shape
        if t > self.config.max_position_embeddings:
            raise ConfigError(
                f"sequence length {t} exceeds model.max_position_embeddings="
                f"{self.config.max_position_embeddings}; shorten the inputs or use a model with more positions."
            )
        embedder = embeddings if embeddings is not None else self.embeddings
        if embedder is None:
            raise ValueError("this encoder borrows its embeddings (an ELECTRA generator): pass embeddings=")
        x = embedder(input_ids, token_type_ids)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)
        # (batch, 1, 1, keys): every query may look at every real key, never at padding. An all-real
        # batch needs no mask; on CPU in eager mode checking costs nothing and saves a pass per layer.
        attn_mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        if attn_mask is not None and eager_cpu(attn_mask) and bool(attn_mask.all()):
            attn_mask = None
        if rows is not None and self.pooler is not None:  # the [CLS] rows too, for the pooler
            rows = torch.cat([rows.new_zeros(b, 1), rows], dim=1)
        if all_layers and rows is not None:
            raise ValueError("all_layers needs every row: pass rows=None")
        states = [x] if all_layers else None
        n = self.config.num_layers
        for i in range(n):
            x = self.layers[0 if self.config.share_layers else i](x, attn_mask, rows if i == n - 1 else None)
            if states is not None:
                states.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if states is not None:
                states[-1] = x
        layers = tuple(states) if states is not None else None
        if self.pooler is None:
            return EncoderOutput(x, None, layers)
        hidden = x if rows is None else x[:, 1:]
        return EncoderOutput(hidden, torch.tanh(self.pooler(x[:, 0])), layers)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int, rows_fraction: float = 1.0) -> float:
        """See :func:`flops_per_token`."""
        return flops_per_token(self.config, seq_len, rows_fraction)


def flops_per_token(cfg: EncoderConfig, seq_len: int, rows_fraction: float = 1.0) -> float:
    """Forward + backward FLOPs per token of an encoder of config ``cfg`` (6 x matmul params +
    attention scores), Kaplan-style. ``rows_fraction``: the fraction of positions the last layer
    computes (see ``Encoder.forward(rows=...)``); its key and value projections still cover every
    position."""
    h = cfg.hidden_size
    key_value = 2 * 2 * h**2
    per_query = 2 * (2 * h**2 + 2 * h * cfg.intermediate_size) + 2 * 2 * seq_len * h  # Q, out, FFN; QK^T, AV
    proj = 2 * cfg.embedding_size * h if cfg.embedding_size != cfg.hidden_size else 0
    if rows_fraction < 1.0 and cfg.add_pooler:
        rows_fraction = min(1.0, rows_fraction + 1.0 / seq_len)  # the [CLS] rows
    forward = cfg.num_layers * key_value + (cfg.num_layers - 1 + rows_fraction) * per_query + proj
    return 3.0 * forward


def count_parameters(cfg: EncoderConfig) -> int:
    with torch.device("meta"):
        return Encoder(cfg).num_parameters()


__all__ = [
    "ConfigError",
    "Embeddings",
    "Encoder",
    "EncoderConfig",
    "EncoderOutput",
    "count_parameters",
    "flops_per_token",
]
