"""Self-attention of the shared encoder: one path for every case.

SelfAttention   project -> split heads -> attention -> merge heads -> output projection. Queries
                are every position, or only the rows a masked LM scores ((batch, slots)
                positions in each sequence), followed by the rows of a second stream of queries
                when there is one (XLNet's query stream); keys and values always cover every
                position of the first.
attention       the scaled dot-product kernel: ``F.scaled_dot_product_attention``, or on CPU in
                eager training the same math with pretrainlab's cheap dropout (a swap-in)

Masks are bool, True where a query may attend a key, of any shape that broadcasts to (batch, heads,
queries, keys): (batch, 1, 1, keys) for padding, (batch, 1, queries, keys) for a pattern per
example, (batch, heads, queries, keys) for one per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.model.dropout import dropout
from pretrainlab.model.fastpath import eager_cpu


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
        w, bias = self.qkv.weight, self.qkv.bias
        if rows is None:  # every position queries: q, k and v from one matmul
            q, k, v = self.qkv(x).split(h, dim=-1)
        else:
            k, v = F.linear(x, w[h:], bias[h:]).split(h, dim=-1)
            q = F.linear(gather_rows(x, rows), w[:h], bias[:h])
        if queries is not None:
            q = torch.cat([q, F.linear(queries, w[:h], bias[:h])], dim=1)
        p = self.attention_dropout if self.training else 0.0
        y = attention(self._split(q), self._split(k), self._split(v), attn_mask, p)
        return self.out(y.transpose(1, 2).reshape(b, -1, h))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, hidden) -> (batch, heads, n, hidden / heads)."""
        b, n, h = x.shape
        return x.view(b, n, self.num_heads, h // self.num_heads).transpose(1, 2)


__all__ = ["SelfAttention", "attention", "gather_rows"]
