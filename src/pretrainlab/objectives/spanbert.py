"""SpanBERT (Joshi et al., 2020): masking of contiguous spans of whole words, and the span boundary
objective (SBO).

Spans: lengths in words drawn from a geometric law (p = 0.2) clipped at 10 words and renormalised
(mean 3.8 words), each starting at a word, until 15% of the tokens are covered; each span is then
shown as all [MASK] (80%), all random tokens (10%) or unchanged (10%), one choice per span. Spans
that touch are one span, as SpanBERT merges them.

SBO: every token of a span is also predicted from the encoder's outputs at the two tokens just
outside the span and the token's offset in it: [left; right; offset embedding] -> dense, GELU,
LayerNorm -> dense, GELU, LayerNorm -> decoder tied to the word embeddings (SpanBERT's
``BertPairTargetPredictionHead``), for the first ``max_targets`` tokens of a span (20, its
``max_pair_targets``). The loss is MLM + SBO. ``boundary_objective=false`` keeps the span masking
alone (the paper's "span masking" rows against subword masking).

Examples are single segments, as SpanBERT trains without NSP: RoBERTa's blocks of whole sentences
(SpanBERT samples contiguous segments of up to 512 tokens). The last layer computes only the
span tokens and their boundaries. Differences from SpanBERT's code: the last span is shortened by
whole words to meet the rate (SpanBERT may cut its last word), and spans are placed without overlap
at free word starts (SpanBERT draws anchors at any token and lets spans run into each other).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pretrainlab.data.examples import Example
from pretrainlab.model.encoder import Encoder, EncoderCall, EncoderConfig, EncoderOutput, flops_per_token
from pretrainlab.model.heads import IGNORE, MaskedLMHead
from pretrainlab.objectives.base import Batch, ObjectiveOutput, loss_weight
from pretrainlab.objectives.learning import HeadCheck, Tally, masked_check, masked_metrics, masked_tally
from pretrainlab.objectives.masked_lm import MaskedLMCollator, mlm_head_flops
from pretrainlab.objectives.masking import corrupt_spans, geometric_probs, select_ngrams, span_boundaries
from pretrainlab.objectives.roberta import RoBERTa
from pretrainlab.tokens import SpecialTokens


@dataclass(frozen=True, eq=False)
class SpanMaskingCollator(MaskedLMCollator):
    """Selects spans of whole words (lengths from ``geometric_probs(span_p, max_span)``) up to the
    rate and corrupts each span as one; with ``boundaries``, adds each selected token's SBO inputs
    as (batch, slots), laid out as ``mlm_positions``: ``sbo_left`` and ``sbo_right`` (the positions
    just outside its span) and ``sbo_offset`` (its offset in the span; -1 in empty slots)."""

    span_p: float = 0.2
    max_span: int = 10
    boundaries: bool = True

    def select(self, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        ids = batch["input_ids"]
        continuation = torch.from_numpy(self.tokens.is_continuation)[ids]
        law = geometric_probs(self.span_p, self.max_span)
        return select_ngrams(self.eligible(ids), continuation, self.masking.rate, self.max_span, generator, law)

    def corrupt(self, input_ids: torch.Tensor, selected: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return corrupt_spans(input_ids, selected, self.masking, self.tokens.mask_id, self.random_candidates, generator)

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        batch, selected = self.masked(examples, generator)
        if self.boundaries:
            left, right, offset = span_boundaries(selected, batch["mlm_positions"])
            filled = batch["mlm_labels"] != IGNORE
            batch["sbo_left"] = torch.where(filled, left, 0)
            batch["sbo_right"] = torch.where(filled, right, 0)
            batch["sbo_offset"] = torch.where(filled, offset, -1)
        return batch


class SpanBoundaryHead(MaskedLMHead):
    """SBO's head: [left; right; offset embedding] (3 x hidden) -> dense, GELU, LayerNorm (hidden)
    -> the masked-LM head's transform (dense, GELU, LayerNorm) and decoder tied to the word
    embeddings, with its own bias."""

    def __init__(self, cfg: EncoderConfig, max_targets: int):
        super().__init__(cfg.hidden_size, cfg.embedding_size, cfg.vocab_size, cfg.layer_norm_eps)
        h = cfg.hidden_size
        self.offsets = nn.Embedding(max_targets, h)
        self.first = nn.Linear(3 * h, h)
        self.first_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        nn.init.normal_(self.offsets.weight, std=0.02)
        nn.init.normal_(self.first.weight, std=0.02)
        nn.init.zeros_(self.first.bias)

    def inputs(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """(..., 3 x hidden): the boundary outputs and the offset's embedding side by side."""
        offset = offset.clamp(0, self.offsets.num_embeddings - 1)
        return torch.cat([left, right, self.offsets(offset)], dim=-1)

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().transform(self.first_norm(torch.nn.functional.gelu(self.first(hidden))))


class SpanBERT(RoBERTa):
    """Span masking + the span boundary objective on single segments (see the module docstring)."""

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "spanbert",
        span_p: float = 0.2,
        max_span: int = 10,
        boundary_objective: bool = True,
        max_targets: int = 20,
        sbo_weight: float = 1.0,
        **masking,
    ):
        super().__init__(encoder_config, tokens, name, **masking)
        if not 0.0 < span_p <= 1.0:
            raise ValueError(f"objective.span_p (the geometric law's p) must be in (0, 1], got {span_p}.")
        if max_span < 1 or max_targets < 1:
            raise ValueError(
                f"objective.max_span ({max_span}) and objective.max_targets ({max_targets}) must be at least 1."
            )
        self.span_p, self.max_span = float(span_p), int(max_span)
        self.boundary_objective, self.max_targets = bool(boundary_objective), int(max_targets)
        self.sbo_weight = loss_weight("sbo_weight", sbo_weight, name)
        self.sbo_head = SpanBoundaryHead(encoder_config, self.max_targets) if self.boundary_objective else None

    def collator(self, length: int | None = None) -> SpanMaskingCollator:
        return SpanMaskingCollator(
            self.tokens,
            self.masking,
            length,
            span_p=self.span_p,
            max_span=self.max_span,
            boundaries=self.boundary_objective,
        )

    def encoder_call(self, batch: Batch) -> EncoderCall | None:
        """The last layer at the span tokens, then (with SBO) at their left and right boundaries:
        (batch, 3 x slots, hidden)."""
        if self.sbo_head is None:
            return super().encoder_call(batch)
        rows = torch.cat([batch["mlm_positions"], batch["sbo_left"], batch["sbo_right"]], dim=1)
        return EncoderCall(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"], rows=rows)

    def split(self, out: EncoderOutput, batch: Batch) -> tuple[EncoderOutput, torch.Tensor, torch.Tensor]:
        """The span tokens' output, the SBO head's inputs, and its labels (the span tokens within
        ``max_targets`` of their span's start)."""
        assert self.sbo_head is not None
        slots = batch["mlm_positions"].shape[1]
        at_span, left, right = out.hidden_states.split(slots, dim=1)
        offset = batch["sbo_offset"]
        labels = torch.where(offset < self.max_targets, batch["mlm_labels"], IGNORE)
        return EncoderOutput(at_span, out.pooled), self.sbo_head.inputs(left, right, offset), labels

    def loss_of(self, encoder: Encoder, batch: Batch, out: EncoderOutput) -> ObjectiveOutput:
        if self.sbo_head is None:
            loss, acc = self.mlm_loss(out, encoder, batch)
            return ObjectiveOutput(loss, {"mlm_loss": loss.detach(), "mlm_acc": acc})
        at_span, sbo_inputs, sbo_labels = self.split(out, batch)
        mlm_loss, mlm_acc = self.mlm_loss(at_span, encoder, batch)
        sbo_loss, sbo_acc = self.sbo_head.loss(sbo_inputs, encoder.word_embeddings.weight, sbo_labels)
        loss = mlm_loss + self.sbo_weight * sbo_loss
        metrics = {"mlm_loss": mlm_loss.detach(), "mlm_acc": mlm_acc, "sbo_loss": sbo_loss.detach(), "sbo_acc": sbo_acc}
        return ObjectiveOutput(loss, metrics)

    @torch.no_grad()
    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        """The MLM head's counts (``mlm_*``) and, with SBO, its head's (``sbo_*``: it never sees the
        span, so every one of its positions counts as a [MASK])."""
        out = self.encode(encoder, batch)
        if self.sbo_head is None:
            return self.mlm_tally(out, encoder, batch)
        at_span, sbo_inputs, sbo_labels = self.split(out, batch)
        head, weight = self.sbo_head, encoder.word_embeddings.weight
        sbo = masked_tally(
            "sbo",
            lambda h: head.logits(h, weight),
            sbo_inputs,
            sbo_labels,
            torch.full_like(sbo_labels, self.tokens.mask_id),
            self.tokens.mask_id,
            weight.shape[0],
        )
        return {**self.mlm_tally(at_span, encoder, batch), **sbo}

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        metrics, checks = super().learning(tally)
        if self.sbo_head is None:
            return metrics, checks
        sbo = masked_metrics("sbo", tally, self.token_counts)
        return {**metrics, **sbo}, [*checks, masked_check("SBO", "sbo", sbo, where="span tokens")]

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        """The encoder with its last layer at the span tokens (and, with SBO, at their two
        boundaries: three rows per span token), the MLM head at the span tokens, and SBO's head
        there (its first layer, 3 x hidden -> hidden, then what the MLM head costs)."""
        rate = self.masking.rate
        if self.sbo_head is None:
            return super().flops_per_token(encoder_config, seq_len)
        h = encoder_config.hidden_size
        first_layer = 3.0 * rate * 2 * (3 * h * h)
        return (
            flops_per_token(encoder_config, seq_len, min(1.0, 3 * rate))
            + 2 * mlm_head_flops(encoder_config, rate)
            + first_layer
        )


__all__ = ["SpanBERT", "SpanBoundaryHead", "SpanMaskingCollator"]
