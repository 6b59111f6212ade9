"""What the causal and the permutation language models share: each predicts tokens its scored rows never
see (the next token; a permutation's targets), from a forward of the shared encoder on blocks of whole
sentences as RoBERTa's (no corruption, no ``[MASK]``), through the masked LMs' head (dense, GELU,
LayerNorm, decoder tied to the word embeddings), so that a comparison changes the objective alone.

A subclass says how its rows are computed (:meth:`Autoregressive.encode`: the hidden states at the scored
positions), makes its head (``lm_head``, after its own parameters: their order is the initialisation's),
and names what it predicts (``prefix``: the metrics' prefix and the batch's ``<prefix>_labels``; ``check_name``
and ``where``: how the held-out check names the head and its positions).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from pretrainlab.data.packing import PackedBlocks
from pretrainlab.model.encoder import Encoder
from pretrainlab.model.heads import MaskedLMHead
from pretrainlab.objectives.base import Batch, Objective, ObjectiveOutput
from pretrainlab.objectives.learning import HeadCheck, Tally, masked_check, masked_metrics, masked_tally


class Autoregressive(Objective):
    """An objective that predicts each scored row's token without showing it (see the module docstring)."""

    prefix: ClassVar[str]  # clm, plm
    check_name: ClassVar[str]  # the held-out check's name of the head
    where: ClassVar[str]  # ... and of the positions it scores
    lm_head: MaskedLMHead

    def example_builder(self, max_seq_len: int) -> PackedBlocks:
        return PackedBlocks(max_seq_len, self.tokens.cls_id, self.tokens.sep_id)

    def encode(self, encoder: Encoder, batch: Batch) -> torch.Tensor:
        """The hidden states the head scores: one row per label of ``<prefix>_labels``."""
        raise NotImplementedError

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        labels = batch[f"{self.prefix}_labels"]
        loss, acc = self.lm_head.loss(self.encode(encoder, batch), encoder.word_embeddings.weight, labels)
        return ObjectiveOutput(loss, {f"{self.prefix}_loss": loss.detach(), f"{self.prefix}_acc": acc})

    @torch.no_grad()
    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        weight = encoder.word_embeddings.weight
        labels = batch[f"{self.prefix}_labels"]
        return masked_tally(
            self.prefix,
            lambda h: self.lm_head.logits(h, weight),
            self.encode(encoder, batch),
            labels,
            torch.full_like(labels, self.tokens.mask_id),  # the predicted token is never in its row's view
            self.tokens.mask_id,
            weight.shape[0],
        )

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        metrics = masked_metrics(self.prefix, tally, self.token_counts)
        return metrics, [masked_check(self.check_name, self.prefix, metrics, where=self.where)]


__all__ = ["Autoregressive"]
