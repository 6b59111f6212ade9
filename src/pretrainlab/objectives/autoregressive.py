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
from pretrainlab.model.encoder import Encoder, EncoderOutput
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
        """The hidden states the head scores: one row per label of ``<prefix>_labels``. By default the
        last layer of :meth:`encoder_call`'s forward; a subclass whose rows need more overrides it."""
        call = self.encoder_call(batch)
        if call is None:
            raise NotImplementedError(f"objective {self.name}: implement encode, or encoder_call")
        return call(encoder).hidden_states

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        call = self.encoder_call(batch)
        if call is not None:
            return self.loss_of(encoder, batch, call(encoder))
        return self.lm_loss(encoder, batch, self.encode(encoder, batch))

    def loss_of(self, encoder: Encoder, batch: Batch, out: EncoderOutput) -> ObjectiveOutput:
        return self.lm_loss(encoder, batch, out.hidden_states)

    def lm_loss(self, encoder: Encoder, batch: Batch, hidden: torch.Tensor) -> ObjectiveOutput:
        """The head's loss and accuracy at ``hidden``, the rows :meth:`encode` gives."""
        labels = batch[f"{self.prefix}_labels"]
        loss, acc = self.lm_head.loss(hidden, encoder.word_embeddings.weight, labels)
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
