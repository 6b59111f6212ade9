"""Permutation language modelling's factorisation orders and two-stream attention masks (XLNet,
Yang et al. 2019), as pure tensor functions. No global RNG: every call takes a generator.

For each sequence a factorisation order is sampled and only its last 1/K is predicted (partial
prediction; K = 6 or 7 in the paper). As in XLNet's own data pipeline, and in ``transformers``'
``DataCollatorForPermutationLanguageModeling``, every token that is not predicted comes first in
the order, all at once: the context, which sees itself and which every position sees. The
predicted tokens (targets) follow in a uniformly random order. Special tokens and padding are never
predicted.

Two streams attend with different masks (True: the query row may attend the key):

    content   a position sees every key not later than itself in the order, itself included
    query     a target sees every key strictly earlier than itself in the order: the context and
              the targets before it, never its own content (what it predicts); a position that
              predicts nothing uses its content row, so that no row is empty

    factorisation_order   rank in the order of each position: -1 for context, 0..k-1 for the targets
    two_stream_masks      the content and query masks of an order, padding keys excluded
"""

from __future__ import annotations

import torch

from pretrainlab.objectives.masking import select_tokens

CONTEXT = -1  # the order of every position that is not predicted


def factorisation_order(eligible: torch.Tensor, predict_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Long (batch, seq): for each row, a uniformly random subset of ``predict_fraction`` of its
    ``eligible`` positions (stochastically rounded: exact in expectation) ranked 0..k-1 in a
    uniformly random order; ``CONTEXT`` (-1) everywhere else."""
    if not 0.0 < predict_fraction < 1.0:
        raise ValueError(
            f"the predicted fraction must be in (0, 1), got {predict_fraction}: with nothing left as context "
            f"the first target would see nothing."
        )
    targets = select_tokens(eligible, predict_fraction, generator)
    scores = torch.rand(eligible.shape, generator=generator).masked_fill(~targets, 2.0)
    ranks = scores.argsort(dim=1).argsort(dim=1)  # the targets take ranks 0..k-1, in a random order
    return torch.where(targets, ranks, torch.full_like(ranks, CONTEXT))


def two_stream_masks(order: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(content, query), bool (batch, seq, seq) of query row x key, from ``order`` (batch, seq) as
    :func:`factorisation_order` makes it and ``attention_mask`` (batch, seq; padding 0)."""
    keys = attention_mask.bool()[:, None, :]
    later = order[:, None, :]  # the key's place in the order
    here = order[:, :, None]  # the query row's
    content = (later <= here) & keys
    query = (later < here) & keys
    query = torch.where((order >= 0)[:, :, None], query, content)
    return content, query


__all__ = ["CONTEXT", "factorisation_order", "two_stream_masks"]
