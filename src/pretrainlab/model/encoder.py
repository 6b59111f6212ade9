"""The shared BERT-family encoder.

One transformer encoder serves every objective, so that a difference in downstream results can
be blamed on the objective and nothing else. It reads top to bottom:

    Dropout        ``nn.Dropout``'s distribution, with keep-masks cheap to draw on a CPU in eager mode
    EncoderConfig  validated shapes (BERT, pre-LN, ALBERT factorisation + sharing, ELECTRA sizes)
    Embeddings     token + learned position + segment embeddings -> LayerNorm -> dropout
    SelfAttention  fused QKV projection, scaled dot-product attention (``attention``: SDPA, or on CPU
                   in eager training the same math with pretrainlab's cheap dropout) under a bool mask
                   (True where a query may attend a key, broadcast to (batch, heads, queries, keys));
                   every position queries, or only the rows a masked LM scores, followed by a second
                   stream of queries when there is one (XLNet's query stream)
    Layer          attention + GELU feed-forward, each with a residual and LayerNorm (post or pre)
    Encoder        embeddings -> (projection) -> layers -> (final LN) -> hidden states, pooled [CLS];
                   with ``rows=``, the last layer computes only the rows a masked LM scores

There is no loss and no ``labels=`` argument here: heads and losses belong to the objectives.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.config import ConfigError
from pretrainlab.model.fastpath import eager_cpu

# --- Dropout ---------------------------------------------------------------------------------
# ``torch.nn.Dropout`` draws one Bernoulli variable per element; on CPU that draw costs about as
# much as a small matmul (≈10 ms per million elements on one core), and a BERT layer drops out
# four tensors. Here the keep-mask comes from 16-bit slices of 64-bit random integers (numpy's
# SFC64 generator): four mask elements per draw, compared with a threshold, about 8x cheaper. The
# drop probability is ``round(p * 2**16) / 2**16`` (0.1 -> 0.09999), and kept values are scaled by
# the exact inverse of the keep probability, so the expectation is unchanged. Each call seeds its
# generator with one draw from torch's default generator: ``torch.manual_seed`` makes it
# reproducible.
#
# On other devices, and under ``torch.compile`` (whose kernels fuse dropout into its neighbours),
# ``torch.nn.functional.dropout`` is used.

_LEVELS = 1 << 16
_MASK64 = (1 << 64) - 1


def _check(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def _random_words(n: int) -> torch.Tensor:
    """n uniformly random 64-bit words (int64). numpy's SFC64 generator makes them about twice as
    fast as torch's Mersenne twister; it is seeded by one draw from torch's default generator."""
    seed = int(torch.empty((), dtype=torch.int64).random_(-(1 << 63), None)) & _MASK64
    return torch.from_numpy(np.random.SFC64(seed).random_raw(n).view(np.int64))


def _keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """(mask, scale): mask * scale is 0 where dropped and 1 / keep-probability where kept.

    In float32 the scale is folded into the mask (one multiply per use); a bf16/fp16 mask holds
    0/1 and the exact scale is applied separately, as the scale itself is not representable there.
    """
    n = math.prod(shape)
    dropped = round(p * _LEVELS)
    scale = _LEVELS / (_LEVELS - dropped)
    bits = _random_words((n + 3) // 4)
    # compared straight into a float tensor: a bool mask would cost a slow bool -> float pass per use
    mask = torch.ge(bits.view(torch.int16)[:n], dropped - (1 << 15), out=torch.empty(n, dtype=dtype)).view(shape)
    if dtype == torch.float32:
        return mask.mul_(scale), 1.0
    return mask, scale


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale, saving only the mask (the gradient is the same product)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask if scale == 1.0 else x * mask * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return (grad * mask if ctx.scale == 1.0 else grad * mask * ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    _check(p)
    if not eager_cpu(x):  # fused kernels (compiled ones, too)
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, *_keep_mask(x.shape, p, x.dtype))


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` (no parameters, so checkpoints are unaffected)."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        _check(p)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


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


@dataclass
class EncoderCall:
    """The arguments of one :meth:`Encoder.forward` call (those an objective's training step makes):
    what an objective's loss needs from the encoder, named before any encoder runs, so that the calls
    of several runs can be made as one (``model.stacked``)."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    rows: torch.Tensor | None = None

    def __call__(self, encoder: Encoder) -> EncoderOutput:
        return encoder(self.input_ids, self.token_type_ids, self.attention_mask, rows=self.rows)


class EncoderOutput(NamedTuple):
    hidden_states: torch.Tensor  # (batch, seq, hidden)
    pooled: torch.Tensor | None  # (batch, hidden): tanh(dense([CLS])), when the config has a pooler
    layers: tuple[torch.Tensor, ...] | None = None  # with all_layers: the embeddings' output, then each layer's
    queries: torch.Tensor | None = None  # with queries: the second stream's last layer (batch, n, hidden)


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


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """q (batch, heads, queries, d), k and v (batch, heads, keys, d), mask bool broadcastable to
    (batch, heads, queries, keys) or None -> (batch, heads, queries, d). Every query row must see at
    least one key.

    SDPA on CPU takes its math path when dropping out, with a Bernoulli draw per attention weight;
    there the same math runs with the cheap CPU dropout, on contiguous (batch x heads) blocks (not
    under torch.compile, whose own kernels do the dropout)."""
    if dropout_p == 0.0 or not eager_cpu(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    b, nh, tq, d = q.shape
    t = k.shape[2]
    q3, k3, v3 = q.reshape(b * nh, tq, d), k.reshape(b * nh, t, d), v.reshape(b * nh, t, d)
    if mask is None:
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(d**-0.5)
    else:  # -inf where a query may not look, added by the same kernel
        rows = mask.shape[-2]  # 1 (the same keys for every query) or tq
        bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))
        bias = bias.expand(b, nh, rows, t).reshape(-1, rows, t)
        scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=d**-0.5)
    return torch.bmm(dropout(scores.softmax(-1), dropout_p), v3).view(b, nh, tq, d)


def linear_part(layer: nn.Module, x: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Outputs ``start:end`` of the linear ``layer`` on ``x``: the queries, or the keys and values, of
    the fused QKV projection. A layer of several runs' weights (``model.stacked``) says how (``part``)."""
    if isinstance(layer, nn.Linear):
        return F.linear(x, layer.weight[start:end], None if layer.bias is None else layer.bias[start:end])
    return layer.part(x, start, end)  # type: ignore[operator]


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(batch, seq, width) at (batch, slots) positions -> (batch, slots, width)."""
    return x.gather(1, rows[:, :, None].expand(-1, -1, x.shape[-1]))


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # one matmul instead of three
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(batch, seq, hidden) -> the same. With ``rows`` ((batch, slots) positions in each
        sequence) only those positions query: keys and values still cover every position; returns
        (batch, slots, hidden). ``queries`` ((batch, n, hidden), a second stream): n more query rows,
        after those of ``x``, projected with the same weights; ``attn_mask`` then has a row for each."""
        b, _, h = x.shape
        if rows is None:  # every position queries: q, k and v from one matmul
            q, k, v = self.qkv(x).split(h, dim=-1)
        else:
            k, v = linear_part(self.qkv, x, h, 3 * h).split(h, dim=-1)
            q = linear_part(self.qkv, gather_rows(x, rows), 0, h)
        if queries is not None:
            q = torch.cat([q, linear_part(self.qkv, queries, 0, h)], dim=1)
        p = self.attention_dropout if self.training else 0.0
        y = attention(self._split(q), self._split(k), self._split(v), attn_mask, p)
        return self.out(y.transpose(1, 2).reshape(b, -1, h))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, hidden) -> (batch, heads, n, hidden / heads)."""
        b, n, h = x.shape
        return x.view(b, n, self.num_heads, h // self.num_heads).transpose(1, 2)


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
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(batch, seq, hidden) -> the same. With ``rows`` ((batch, slots) positions in each sequence)
        every position is still attended to, but only those query, and only they go through the
        feed-forward: (batch, slots, hidden). With ``queries`` ((batch, n, hidden), a second stream)
        its rows follow those of ``x`` through the same attention (keys and values from ``x`` alone)
        and feed-forward: the output has n more rows, and ``attn_mask`` a row for each."""
        residual = x if rows is None else gather_rows(x, rows)
        if queries is not None:
            residual = torch.cat([residual, queries], dim=1)
        if self.pre_ln:
            normed = None if queries is None else self.attention_norm(queries)
            y = residual + self.dropout(self.attention(self.attention_norm(x), attn_mask, rows, normed))
            return y + self.dropout(self.ffn(self.ffn_norm(y)))
        y = self.attention_norm(residual + self.dropout(self.attention(x, attn_mask, rows, queries)))
        return self.ffn_norm(y + self.dropout(self.ffn(y)))


def attention_pattern(attention_mask: torch.Tensor | None, num_heads: int) -> torch.Tensor | None:
    """The bool mask the layers take (True: the query may attend the key), from what
    :meth:`Encoder.forward` accepts: (batch, seq) padding (1 real, 0 padding) -> (batch, 1, 1, seq);
    (batch, queries, seq) a pattern per example -> (batch, 1, queries, seq); (batch, heads or 1,
    queries, seq) as it is."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        return attention_mask.bool()[:, None, None, :]
    if attention_mask.dim() == 3:
        return attention_mask.bool()[:, None]
    if attention_mask.dim() == 4 and attention_mask.shape[1] in (1, num_heads):
        return attention_mask.bool()
    raise ValueError(
        f"attention_mask of shape {tuple(attention_mask.shape)}: give (batch, seq) padding, (batch, queries, "
        f"seq) or (batch, heads, queries, seq) with heads 1 or {num_heads}."
    )


def two_streams(mask: torch.Tensor | None, query_mask: torch.Tensor, b: int, rows: int, t: int) -> torch.Tensor:
    """One mask for a layer's two streams of query rows: ``mask`` (the first stream's ``rows`` rows, as
    :func:`attention_pattern` gives it; None: every key) above ``query_mask`` (the second's), both
    (batch, heads or 1, rows or 1, t)."""
    first = torch.ones(b, 1, 1, t, dtype=torch.bool, device=query_mask.device) if mask is None else mask
    heads = max(first.shape[1], query_mask.shape[1])
    return torch.cat([first.expand(b, heads, rows, t), query_mask.expand(b, heads, -1, t)], dim=2)


def mask_rows(mask: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor | None:
    """A mask's rows for the queries ``rows`` ((batch, slots) positions) alone: a mask with one row for
    every query is gathered; one whose single row serves every query is returned as it is."""
    if mask is None or rows is None or mask.shape[2] == 1:
        return mask
    b, mh, _, t = mask.shape
    return mask.gather(2, rows[:, None, :, None].expand(b, mh, rows.shape[1], t))


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
        queries: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """``attention_mask``: which keys each query may attend. (batch, seq): 1/True for real tokens,
        0/False for padding, the same for every query; (batch, seq, seq) or (batch, heads, seq, seq),
        bool: a pattern per example (and head), True where the query row may attend the key (a
        causal, prefix or permutation mask, padding included); None: everything, nothing padded.
        ``embeddings``: another encoder's embeddings, for an encoder built without its own.
        ``rows``: (batch, slots) positions in each sequence, the only ones whose output is wanted (the
        masked positions of a masked LM; unused slots may repeat a position). Only those query in
        the last layer and go through its output projection and feed-forward, and ``hidden_states``
        is (batch, slots, hidden); the pooled [CLS] vector is unaffected. Every layer still attends
        over all positions, so the rows are exactly what the full forward would give (up to dropout
        draws). Their shape comes from the batch, so nothing here waits for the device.
        ``all_layers``: also return every layer's output (``layers``: the embeddings, projected to
        the hidden size, then each layer; the last is ``hidden_states``), for feature extraction.
        ``queries``: (batch, n, hidden), a second stream (XLNet's query stream) that goes through
        every layer with the same weights, querying the first stream's keys and values of the layer
        below and never being attended itself; ``query_mask`` ((batch, n, seq) or (batch, heads, n,
        seq), bool) says which positions each of its rows sees. Its last layer is ``queries`` in the
        output."""
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
        attn_mask = attention_pattern(attention_mask, self.config.num_heads)
        # A padding mask of an all-real batch masks nothing; on CPU in eager mode checking costs
        # nothing and saves a pass per layer.
        if attn_mask is not None and attn_mask.shape[2] == 1 and eager_cpu(attn_mask) and bool(attn_mask.all()):
            attn_mask = None
        if rows is not None and self.pooler is not None:  # the [CLS] rows too, for the pooler
            rows = torch.cat([rows.new_zeros(b, 1), rows], dim=1)
        if all_layers and rows is not None:
            raise ValueError("all_layers needs every row: pass rows=None")
        last_mask = mask_rows(attn_mask, rows)
        m = t if rows is None else rows.shape[1]  # the first stream's query rows in the last layer
        if queries is not None:
            second = attention_pattern(query_mask, self.config.num_heads)
            if second is None:
                raise ValueError("queries need a query_mask: which positions each query row sees")
            attn_mask = two_streams(attn_mask, second, b, t, t)
            last_mask = two_streams(last_mask, second, b, m, t)
        states = [x] if all_layers else None
        n = self.config.num_layers
        g = queries
        for i in range(n):
            layer = self.layers[0 if self.config.share_layers else i]
            last = i == n - 1
            y = layer(x, last_mask if last else attn_mask, rows if last else None, g)
            x, g = (y, None) if g is None else (y[:, : m if last else t], y[:, m if last else t :])
            if states is not None:
                states.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            g = None if g is None else self.final_norm(g)
            if states is not None:
                states[-1] = x
        layers = tuple(states) if states is not None else None
        if self.pooler is None:
            return EncoderOutput(x, None, layers, g)
        hidden = x if rows is None else x[:, 1:]
        return EncoderOutput(hidden, torch.tanh(self.pooler(x[:, 0])), layers, g)

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
    "EncoderCall",
    "EncoderConfig",
    "EncoderOutput",
    "SelfAttention",
    "attention",
    "count_parameters",
    "flops_per_token",
    "gather_rows",
]
