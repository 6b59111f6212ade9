"""XLNet's objective (Yang et al., 2019): permutation language modelling with two-stream attention, on
the shared encoder. Only the objective: what XLNet adds beyond it (Transformer-XL's segment memory,
relative positional encodings, the bidirectional data input pipeline) is architecture and is left
out, so ``objective=xlnet`` is XLNet's objective on a BERT-style encoder with absolute positions, not
XLNet.

For each sequence a factorisation order is sampled (``objectives.permutation``): the last
``1/partial_prediction`` of its tokens (K = 6 or 7 in the paper) are the targets, in a random order
after the rest, the context. Every target is predicted from the tokens before it in the order:

- the content stream is the encoder as fine-tuning uses it, on the uncorrupted tokens (no
  ``[MASK]``), each position seeing every position not later than itself in the order;
- the query stream runs through the same layers with the same weights (``Encoder.forward(queries=)``,
  no copy of the encoder). Its row for a target starts from a learned vector plus the target's
  position embedding (the position it predicts, as XLNet's relative encoding gives its query stream),
  and sees the content of the positions strictly before the target in the order, never its own. It
  is computed for the targets only.

The query stream's last layer goes through the same masked-LM head as the other objectives (dense,
GELU, LayerNorm, decoder tied to the word embeddings), so that a comparison of objectives changes the
objective alone; XLNet's own head is the tied decoder without the transform.

The encoder exported is the content stream's: it fine-tunes and exports to ``transformers`` as a
BERT encoder. The query vector and the head are pretraining-only and have no ``transformers`` class.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn

from pretrainlab.data.examples import Example
from pretrainlab.model.encoder import Encoder, EncoderConfig, flops_per_token
from pretrainlab.model.heads import MaskedLMHead
from pretrainlab.objectives.autoregressive import Autoregressive
from pretrainlab.objectives.base import Batch, pad_examples, pseudo_log_likelihood
from pretrainlab.objectives.masked_lm import mlm_head_flops
from pretrainlab.objectives.masking import max_selected, slot_layout
from pretrainlab.objectives.permutation import factorisation_order, two_stream_masks
from pretrainlab.tokens import SpecialTokens


@dataclass(frozen=True, eq=False)
class PermutationCollator:
    """Pads, samples a factorisation order per sequence and lays out its two masks.

    The batch carries the targets' positions and ids as (batch, slots) (``plm_positions``,
    ``plm_labels``; empty slots at position 0 labelled ``IGNORE``), the content mask
    (``content_mask``, (batch, seq, seq)) and the targets' query-stream rows (``query_mask``, (batch,
    slots, seq)); True where the row may attend the key. With ``length``, every batch is padded to it
    and has a fixed number of slots."""

    tokens: SpecialTokens
    predict_fraction: float
    length: int | None = None

    def eligible(self, input_ids: torch.Tensor) -> torch.Tensor:
        special = torch.zeros_like(input_ids, dtype=torch.bool)
        for i in self.tokens.special_ids:
            special |= input_ids == i
        return ~special

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        batch = pad_examples(examples, self.tokens.pad_id, length=self.length)
        order = factorisation_order(self.eligible(batch["input_ids"]), self.predict_fraction, generator)
        content, query = two_stream_masks(order, batch["attention_mask"])
        slots = None if self.length is None else max_selected(self.length, self.predict_fraction)
        positions, labels = slot_layout(order >= 0, batch["input_ids"], slots)
        batch["plm_positions"], batch["plm_labels"] = positions, labels
        batch["content_mask"] = content
        batch["query_mask"] = query.gather(1, positions[:, :, None].expand(-1, -1, query.shape[2]))
        return batch


class XLNet(Autoregressive):
    """Permutation language modelling (see the module docstring). ``partial_prediction``: K, the
    targets are the last 1/K of each sequence's (non-special) tokens in its factorisation order."""

    hf_head_class = False  # transformers' XLNetLMHeadModel is XLNet's architecture, not this encoder
    prefix, check_name, where = "plm", "PLM at its targets", "its targets"

    def __init__(
        self, encoder_config: EncoderConfig, tokens: SpecialTokens, name: str = "xlnet", partial_prediction: float = 6.0
    ):
        super().__init__(encoder_config, tokens, name)
        if not partial_prediction > 1:
            raise ValueError(
                f"objective.partial_prediction must be above 1 (K: the last 1/K of each order is predicted; "
                f"the paper uses 6 or 7), got {partial_prediction}."
            )
        self.predict_fraction = 1.0 / float(partial_prediction)
        self.query_vector = nn.Parameter(torch.empty(encoder_config.embedding_size))
        nn.init.normal_(self.query_vector, std=encoder_config.initializer_range)
        self.lm_head = MaskedLMHead.for_encoder(encoder_config)

    def targets_per_sequence(self, max_seq_len: int) -> dict[str, float]:
        return {
            f"objective.partial_prediction={1 / self.predict_fraction:g}": (max_seq_len - 2) * self.predict_fraction
        }

    def collator(self, length: int | None = None) -> PermutationCollator:
        return PermutationCollator(self.tokens, self.predict_fraction, length)

    def query_stream(self, encoder: Encoder, positions: torch.Tensor) -> torch.Tensor:
        """The query stream's input at ``positions`` ((batch, n)): the learned vector plus each
        position's embedding (and the first segment's), through the embeddings' LayerNorm, dropout
        and projection, as the content stream's tokens go: (batch, n, hidden)."""
        emb = encoder.embeddings
        assert emb is not None
        g = self.query_vector + emb.position_embeddings(positions) + emb.token_type_embeddings.weight[0]
        g = emb.dropout(emb.norm(g))
        return g if encoder.embedding_projection is None else encoder.embedding_projection(g)

    def encode(self, encoder: Encoder, batch: Batch) -> torch.Tensor:
        """The query stream's last layer at the targets: (batch, slots, hidden)."""
        positions = batch["plm_positions"]
        out = encoder(
            batch["input_ids"],
            None,
            batch["content_mask"],
            rows=positions[:, :1],  # the content stream's last layer is not read: one row of it
            queries=self.query_stream(encoder, positions),
            query_mask=batch["query_mask"],
        )
        assert out.queries is not None
        return out.queries

    def target_logits(self, encoder: Encoder, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """float32 vocabulary logits (batch, vocab) for the token at ``target`` ((batch,) positions) of
        each row of ``ids``, scored as the one target of an order whose context is every other token:
        its query row and every other position's content row see all positions but the target (so
        that nothing of the target's token reaches its query row, not even through another position's
        content), the target's own content row sees everything."""
        keys = torch.arange(ids.shape[1], device=ids.device)
        hidden = keys[None, :] == target[:, None]  # (batch, seq): the target's own key
        content = ~hidden[:, None, :] | (keys[None, :, None] == target[:, None, None])
        out = encoder(
            ids,
            None,
            content,
            rows=target[:, None],
            queries=self.query_stream(encoder, target[:, None]),
            query_mask=~hidden[:, None, :],
        )
        assert out.queries is not None
        return self.lm_head.logits(out.queries[:, 0], encoder.word_embeddings.weight).float()

    @torch.no_grad()
    def sentence_scores(self, encoder: Encoder, sequences: list[np.ndarray], max_tokens: int = 8192) -> np.ndarray:
        """The pseudo-log-likelihood of the permutation LM: the sum, over the sequence's tokens ([CLS]
        and [SEP] excepted), of log p(token | every other token), each token scored as the one target
        of an order whose context is every other token (``target_logits``). One copy of the sequence
        per scored token, copies of one length stacked, about ``max_tokens`` tokens at a time."""
        device = encoder.word_embeddings.weight.device
        return pseudo_log_likelihood(
            sequences, self.tokens.special_ids, device, partial(self.target_logits, encoder), max_tokens
        )

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        """The content stream (its last layer at one row) plus the query stream at the targets only:
        per target and layer, its query and output projections, feed-forward and attention over the
        sequence (the keys and values are the content stream's), and the head."""
        c, k = encoder_config, self.predict_fraction
        h = c.hidden_size
        per_query_row = 2 * (2 * h**2 + 2 * h * c.intermediate_size) + 2 * 2 * seq_len * h
        content = flops_per_token(c, seq_len, rows_fraction=1.0 / seq_len)
        return content + 3.0 * c.num_layers * per_query_row * k + mlm_head_flops(c, k)


__all__ = ["PermutationCollator", "XLNet"]
