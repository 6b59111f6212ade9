"""Prediction heads that sit on the shared encoder. Objectives own them; the encoder never does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.model.fastpath import eager_cpu
from pretrainlab.model.vocab_loss import linear_cross_entropy, plain_cross_entropy

IGNORE = -100  # the label of a slot that is not scored


class MaskedLMHead(nn.Module):
    """Transform (dense, GELU, LayerNorm) then a decoder tied to the input word embeddings.

    Tying: the decoder reuses the word-embedding matrix, which halves the vocabulary parameters and
    is what BERT, ALBERT and ELECTRA do. The transform maps hidden -> embedding size, so factorised
    embeddings (ALBERT) tie just as well. Only the rows given are scored: callers pass the hidden
    states of the masked positions (sparse prediction), ~15% of the tokens instead of all of them,
    which removes most of the vocabulary-sized matmul and log-softmax. ``loss`` goes further and
    never holds the (rows x vocab) logits at once (see ``pretrainlab.model.vocab_loss``).
    """

    def __init__(self, hidden_size: int, embedding_size: int, vocab_size: int, layer_norm_eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.norm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    @classmethod
    def for_encoder(cls, cfg) -> MaskedLMHead:
        """The head that sits on an encoder of config ``cfg`` (an ``EncoderConfig``)."""
        return cls(cfg.hidden_size, cfg.embedding_size, cfg.vocab_size, cfg.layer_norm_eps)

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(hidden)))

    def logits(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """The vocabulary logits of ``hidden`` (..., d): the transform, then the decoder tied to
        ``word_embeddings`` (the encoder's word-embedding matrix)."""
        return F.linear(self.transform(hidden), word_embeddings, self.bias)

    def loss(
        self,
        hidden: torch.Tensor,
        word_embeddings: torch.Tensor,
        labels: torch.Tensor,
        temperature: float | None = None,
        uniform: torch.Tensor | None = None,
    ):
        """Mean cross-entropy of the slots' logits against ``labels`` and the accuracy of their
        argmax, over the slots whose label is not ``IGNORE``; with ``temperature``, also one sample
        per slot from softmax(logits / temperature), by inverse CDF at ``uniform``. hidden (..., d),
        labels and uniform (...). Same values and gradients as ``F.cross_entropy`` of the logits
        :meth:`logits`.

        In eager mode on CPU the scored rows are picked out and the vocabulary is taken a slice at a
        time (``linear_cross_entropy``); elsewhere every slot is scored from its full logits
        (``plain_cross_entropy``), with no shape that depends on the data."""
        shape = labels.shape
        hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
        uniform = None if uniform is None else uniform.reshape(-1)
        if not eager_cpu(hidden):
            out = plain_cross_entropy(
                self.transform(hidden), word_embeddings, self.bias, labels, IGNORE, temperature, uniform
            )
            return out if temperature is None else (*out[:2], out[2].view(shape))
        rows = (labels != IGNORE).nonzero().squeeze(1)
        if rows.numel() == 0:  # nothing to predict in this batch: no loss and no gradient, not 0/0
            # one row through the head, times 0: every parameter in the graph (as DDP expects), all gradients 0
            zero = self.logits(hidden[:1], word_embeddings).float().sum() * 0.0
            if temperature is None:
                return zero, zero.detach()
            return zero, zero.detach(), torch.full_like(labels, IGNORE).view(shape)
        out = linear_cross_entropy(
            self.transform(hidden[rows]),
            word_embeddings,
            self.bias,
            labels[rows],
            temperature,
            None if uniform is None else uniform[rows],
        )
        if temperature is None:
            return out
        samples = torch.full_like(labels, IGNORE).index_put_((rows,), out[2])
        return out[0], out[1], samples.view(shape)


class PairHead(nn.Module):
    """Two-way classifier on the pooled [CLS] vector: next-sentence (NSP) or sentence-order (SOP)."""

    def __init__(self, hidden_size: int, num_labels: int = 2):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)


class TokenHead(nn.Module):
    """Per-token binary logit (ELECTRA's replaced-token detection): dense, GELU, dense -> 1."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, 1)
        for layer in (self.dense, self.out):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(hidden))).squeeze(-1)
