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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pretrainlab.data.examples import Example
from pretrainlab.model.encoder import Encoder, EncoderConfig, EncoderOutput, flops_per_token
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
    seq)) the causal rows' next tokens (``IGNORE`` in the other kind's rows)."""

    causal_share: float = 1 / 16

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
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
    """Masked and causal examples in one batch (see the module docstring)."""

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "gpt_bert",
        causal_share: float = 1 / 16,
        **masking,
    ):
        super().__init__(encoder_config, tokens, name, **masking)
        if not 0.0 < causal_share < 1.0:
            raise ValueError(
                f"objective.causal_share must be in (0, 1), got {causal_share}: 0 is objective=roberta, 1 is "
                f"objective=clm."
            )
        self.causal_share = causal_share

    def collator(self, length: int | None = None) -> HybridCollator:
        return HybridCollator(self.tokens, self.masking, length, causal_share=self.causal_share)

    def hidden(self, encoder: Encoder, batch: Batch) -> torch.Tensor:
        """Every position's last layer, each row under its own pattern: causal rows causal, masked rows
        bidirectional (padding excluded)."""
        real = batch["attention_mask"].bool()
        pattern = torch.where(batch["causal"][:, None, None], causal_mask(real), real[:, None, :])
        return encoder(batch["input_ids"], None, pattern).hidden_states

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        """One loss, the mean over every predicted token of the batch, both kinds together (their
        rows and labels side by side; a batch may hold no causal row). Each kind's accuracy is in
        the held-out checks (``learning/mlm_*``, ``learning/clm_*``)."""
        hidden = self.hidden(encoder, batch)
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
        hidden = self.hidden(encoder, batch)
        positions = batch["mlm_positions"]
        at_masked = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
        masked = self.mlm_tally(EncoderOutput(at_masked, None), encoder, batch)
        weight = encoder.word_embeddings.weight
        labels = batch["clm_labels"]
        causal = masked_tally(
            "clm",
            lambda h: F.linear(self.mlm_head.transform(h), weight, self.mlm_head.bias),
            hidden,
            labels,
            torch.full_like(labels, self.tokens.mask_id),  # the next token is never in view
            self.tokens.mask_id,
            weight.shape[0],
        )
        return {**masked, **causal}

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        mlm = masked_metrics("mlm", tally, self.token_counts)
        clm = masked_metrics("clm", tally, self.token_counts)
        return {**mlm, **clm}, [
            masked_check("MLM at [MASK]", "mlm", mlm),
            masked_check("next token", "clm", clm, where="the next token"),
        ]

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        """Every row of the encoder (a causal example needs them all; the masked ones run in the same
        forward) and the head at the predicted tokens of both kinds."""
        share, rate = self.causal_share, self.masking.rate
        return flops_per_token(encoder_config, seq_len) + mlm_head_flops(encoder_config, share + (1 - share) * rate)


__all__ = ["GPTBERT", "HybridCollator"]
