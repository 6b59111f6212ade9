"""The masked-causal hybrid (GPT-BERT; Charpentier & Samuel, 2024, the BabyLM 2024 winner): one
encoder trained on masked and causal examples mixed at a set ratio, ``causal_share`` of the
examples (1/16 by default: the paper's best, 1 causal to 15 masked).

A masked example is RoBERTa's (15% of its tokens predicted, 80/10/10, bidirectional attention); a
causal example predicts every next token under a causal mask (``objectives.clm``). Both kinds share
one batch, one forward (a pattern per example) and one head, the masked LMs' (dense, GELU,
LayerNorm, decoder tied to the word embeddings). GPT-BERT's masked examples predict a masked token
from the position before it (its "masked next-token prediction", so that one shifted head serves
both modes); here a masked token is predicted at its own position, as every other masked LM of the
platform does, so that the hybrid differs from RoBERTa and from the causal LM only in the mix. The
loss is the mean over every predicted token of the batch, both kinds together.

Two phases, causal then masked (``causal_first``; Gisserot-Boukhlef et al., 2025, "Should We Still
Pretrain Encoders with Masked Language Modeling?": CLM then MLM at a fixed budget): for that share of
the run every example is causal, then ``causal_share`` of them (0: RoBERTa's masked LM alone, the
``clm_mlm`` objective). The phase follows the optimizer step over the steps the budget plans, as
every schedule does; held-out batches are those of the run's end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import torch

from pretrainlab.data.examples import Example
from pretrainlab.model.encoder import Encoder, EncoderCall, EncoderConfig, EncoderOutput, flops_per_token
from pretrainlab.model.heads import IGNORE
from pretrainlab.objectives.base import Batch, ObjectiveOutput
from pretrainlab.objectives.clm import causal_mask, next_tokens
from pretrainlab.objectives.learning import HeadCheck, Tally, masked_check, masked_metrics, masked_tally
from pretrainlab.objectives.masked_lm import MaskedLMCollator, mlm_head_flops
from pretrainlab.objectives.roberta import RoBERTa
from pretrainlab.tokens import SpecialTokens


@dataclass(frozen=True, eq=False)
class HybridCollator(MaskedLMCollator):
    """Pads; ``causal_share`` of the examples (stochastically rounded per batch, chosen at random)
    are causal, the others masked as RoBERTa's. ``causal`` (batch,) says which; ``mlm_positions``
    and ``mlm_labels`` ((batch, slots)) hold the masked rows' predictions, ``clm_labels`` ((batch,
    seq)) the causal rows' next tokens (``IGNORE`` in the other kind's rows). At a share of 0 the
    batch is RoBERTa's (no causal keys).

    ``causal_first``: the share of the run, from its start, in which every example is causal (CLM
    then MLM); ``at(progress)`` resolves it. Called as it is, the collator is that of the run's end."""

    causal_share: float = 1 / 16
    causal_first: float = 0.0

    def at(self, progress: float) -> HybridCollator:
        share = 1.0 if progress < self.causal_first else self.causal_share
        return replace(cast(HybridCollator, super().at(progress)), causal_share=share, causal_first=0.0)

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        if self.causal_share == 0:
            return MaskedLMCollator.__call__(self, examples, generator)
        n = len(examples)
        k = int(np.floor(n * self.causal_share + torch.rand((), generator=generator, dtype=torch.float64).item()))
        causal = torch.zeros(n, dtype=torch.bool)
        causal[torch.randperm(n, generator=generator)[:k]] = True
        batch = MaskedLMCollator.__call__(self, examples, generator)
        # the causal rows are shown uncorrupted, predict every next token and nothing masked
        ids, positions, labels = batch["input_ids"], batch["mlm_positions"], batch["mlm_labels"]
        shown = ids.gather(1, positions)
        original = ids.scatter(1, positions, torch.where(labels != IGNORE, labels, shown))
        batch["input_ids"] = torch.where(causal[:, None], original, ids)
        batch["mlm_labels"] = torch.where(causal[:, None], IGNORE, labels)
        batch["clm_labels"] = torch.where(
            causal[:, None], next_tokens(batch["input_ids"], batch["attention_mask"]), IGNORE
        )
        batch["causal"] = causal
        return batch


class GPTBERT(RoBERTa):
    """Masked and causal examples in one batch (see the module docstring); with ``causal_first``,
    causal examples alone for that share of the run first (CLM then MLM)."""

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "gpt_bert",
        causal_share: float = 1 / 16,
        causal_first: float = 0.0,
        **masking,
    ):
        super().__init__(encoder_config, tokens, name, **masking)
        if not 0.0 <= causal_first < 1.0:
            raise ValueError(
                f"objective.causal_first must be in [0, 1) (the share of the run trained causal first), got {causal_first}."
            )
        if not 0.0 <= causal_share < 1.0 or (causal_share == 0 and causal_first == 0):
            raise ValueError(
                f"objective.causal_share must be in (0, 1), or 0 after a causal phase (objective.causal_first > 0), "
                f"got {causal_share}: a share of 0 throughout is objective=roberta, 1 is objective=clm."
            )
        self.causal_share, self.causal_first = float(causal_share), float(causal_first)

    def collator(self, length: int | None = None) -> HybridCollator:
        return HybridCollator(
            self.tokens, self.masking, length, causal_share=self.causal_share, causal_first=self.causal_first
        )

    @property
    def scheduled(self) -> bool:
        return self.masking.scheduled or self.causal_first > 0

    @contextmanager
    def settings_at(self, progress: float) -> Iterator[None]:
        share = self.causal_share
        self.causal_share = 1.0 if progress < self.causal_first else share
        try:
            with super().settings_at(progress):
                yield
        finally:
            self.causal_share = share

    def encoder_call(self, batch: Batch) -> EncoderCall | None:
        """With causal rows: every position's last layer, each row under its own pattern (causal rows
        causal, masked rows bidirectional, padding excluded). Without (a share of 0): RoBERTa's."""
        if "clm_labels" not in batch:
            return super().encoder_call(batch)
        return self.every_row(batch)

    def every_row(self, batch: Batch) -> EncoderCall:
        """Every position's last layer, each row under its own pattern (``batch["causal"]``)."""
        real = batch["attention_mask"].bool()
        pattern = torch.where(batch["causal"][:, None, None], causal_mask(real), real[:, None, :])
        return EncoderCall(batch["input_ids"], None, pattern)

    def hidden(self, encoder: Encoder, batch: Batch) -> torch.Tensor:
        """Every position's last layer, each row under its own pattern: causal rows causal, masked rows
        bidirectional (padding excluded)."""
        return self.every_row(batch)(encoder).hidden_states

    def loss_of(self, encoder: Encoder, batch: Batch, out: EncoderOutput) -> ObjectiveOutput:
        """One loss, the mean over every predicted token of the batch, both kinds together (their
        rows and labels side by side; a batch may hold no causal row). Each kind's accuracy is in
        the held-out checks (``learning/mlm_*``, ``learning/clm_*``). A batch without causal rows
        (a share of 0) is RoBERTa's: the last layer runs at the masked rows only."""
        if "clm_labels" not in batch:
            loss, acc = self.mlm_loss(out, encoder, batch)
            return ObjectiveOutput(loss, {"lm_loss": loss.detach(), "lm_acc": acc})
        hidden = out.hidden_states
        positions = batch["mlm_positions"]
        at_masked = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
        rows = torch.cat([at_masked, hidden], dim=1)
        labels = torch.cat([batch["mlm_labels"], batch["clm_labels"]], dim=1)
        loss, acc = self.mlm_head.loss(rows, encoder.word_embeddings.weight, labels)
        return ObjectiveOutput(loss, {"lm_loss": loss.detach(), "lm_acc": acc})

    @torch.no_grad()
    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        """The masked rows' counts (as RoBERTa's, ``mlm_*``) and the causal rows' (as the causal LM's,
        ``clm_*``)."""
        if "clm_labels" not in batch:
            return self.mlm_tally(self.encode(encoder, batch), encoder, batch)
        hidden = self.hidden(encoder, batch)
        positions = batch["mlm_positions"]
        at_masked = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
        masked = self.mlm_tally(EncoderOutput(at_masked, None), encoder, batch)
        weight = encoder.word_embeddings.weight
        labels = batch["clm_labels"]
        causal = masked_tally(
            "clm",
            lambda h: self.mlm_head.logits(h, weight),
            hidden,
            labels,
            torch.full_like(labels, self.tokens.mask_id),  # the next token is never in view
            self.tokens.mask_id,
            weight.shape[0],
        )
        return {**masked, **causal}

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        """Each kind's head beside its baseline, for the kinds the held-out batches hold (those of the
        run's end: after a causal phase, the masked rows alone)."""
        metrics: dict[str, float] = {}
        checks = []
        for prefix, head, where in (("mlm", "MLM at [MASK]", "[MASK]"), ("clm", "next token", "the next token")):
            if tally.get(f"{prefix}_n_mask"):
                m = masked_metrics(prefix, tally, self.token_counts)
                metrics |= m
                checks.append(masked_check(head, prefix, m, where=where))
        return metrics, checks

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        """Every row of the encoder (a causal example needs them all; the masked ones run in the same
        forward) and the head at the predicted tokens of both kinds; at a share of 0, RoBERTa's."""
        share, rate = self.causal_share, self.masking.rate
        if share == 0:
            return super().flops_per_token(encoder_config, seq_len)
        return flops_per_token(encoder_config, seq_len) + mlm_head_flops(encoder_config, share + (1 - share) * rate)


__all__ = ["GPTBERT", "HybridCollator"]
