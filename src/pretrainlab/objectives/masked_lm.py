"""Masked language modelling, the part RoBERTa, BERT and ALBERT share (and ELECTRA's generator uses).

MaskedLMCollator  pads a batch, selects ~rate of its tokens and corrupts them (80/10/10); the
                  batch carries their positions and original ids per sequence (``mlm_positions``,
                  ``mlm_labels``, (batch, slots)), so only they are scored
MaskedLM          the base of masked-LM objectives: masking settings, the MLM head tied to the
                  word embeddings, its loss, its FLOPs and its Hugging Face export
mlm_head_flops    the cost of a sparse tied MLM head
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch

from pretrainlab.data.examples import Example
from pretrainlab.model.encoder import Encoder, EncoderCall, EncoderConfig, EncoderOutput, flops_per_token
from pretrainlab.model.heads import MaskedLMHead
from pretrainlab.objectives.base import Batch, Objective, ObjectiveOutput, pad_examples, pseudo_log_likelihood
from pretrainlab.objectives.learning import HeadCheck, Tally, masked_check, masked_metrics, masked_tally
from pretrainlab.objectives.masking import (
    MaskingConfig,
    corrupt,
    max_selected,
    select_ngrams,
    select_tokens,
    slot_layout,
)
from pretrainlab.tokens import SpecialTokens


@dataclass(frozen=True, eq=False)
class MaskedLMCollator:
    """Pads, then selects ~rate of the non-special tokens and corrupts them (80/10/10).

    Masks are drawn anew every time an example is seen (dynamic masking, as RoBERTa). The batch
    carries the selected tokens' positions in each sequence and their original ids, as (batch,
    slots) with empty slots at position 0 labelled ``IGNORE``, so the head scores only those
    (sparse prediction) and the model needs no data-dependent shape. With ``length``, every batch
    is padded to it and has ``max_selected(length, rate)`` slots: fixed shapes.
    """

    tokens: SpecialTokens
    masking: MaskingConfig
    length: int | None = None
    slot_rate: float | None = None  # the rate fixed slots are sized for (a schedule's peak); None: the rate

    def at(self, progress: float) -> MaskedLMCollator:
        """The collator at ``progress`` (0 to 1) of the run: its masking rate there (a schedule), with
        the slots of the schedule's peak, so that fixed shapes stay fixed."""
        if not self.masking.scheduled:
            return self
        return replace(self, masking=self.masking.at(progress), slot_rate=self.masking.peak_rate)

    @cached_property
    def random_candidates(self) -> torch.Tensor:
        return torch.from_numpy(self.tokens.random_candidates())

    def eligible(self, input_ids: torch.Tensor) -> torch.Tensor:
        special = torch.zeros_like(input_ids, dtype=torch.bool)
        for i in self.tokens.special_ids:
            special |= input_ids == i
        return ~special

    def select(self, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        ids = batch["input_ids"]
        if self.masking.whole_word:
            continuation = torch.from_numpy(self.tokens.is_continuation)[ids]
            return select_ngrams(self.eligible(ids), continuation, self.masking.rate, 1, generator)
        return select_tokens(self.eligible(ids), self.masking.rate, generator)

    def corrupt(self, input_ids: torch.Tensor, selected: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """What the model is shown: the selected tokens corrupted 80/10/10, each on its own."""
        return corrupt(input_ids, selected, self.masking, self.tokens.mask_id, self.random_candidates, generator)

    def masked(self, examples: list[Example], generator: torch.Generator) -> tuple[Batch, torch.Tensor]:
        """The batch and its selected positions ((batch, seq) bool)."""
        batch = pad_examples(examples, self.tokens.pad_id, length=self.length)
        selected = self.select(batch, generator)
        original = batch["input_ids"]
        batch["input_ids"] = self.corrupt(original, selected, generator)
        slots = None if self.length is None else max_selected(self.length, self.slot_rate or self.masking.peak_rate)
        batch["mlm_positions"], batch["mlm_labels"] = slot_layout(selected, original, slots)
        return batch, selected

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        return self.masked(examples, generator)[0]


def mlm_head_flops(encoder_config: EncoderConfig, mask_rate: float) -> float:
    """Training FLOPs per input token of a sparse, tied MLM head (only mask_rate of tokens scored)."""
    c = encoder_config
    per_scored = 2 * (c.hidden_size * c.embedding_size + c.embedding_size * c.vocab_size)
    return 3.0 * mask_rate * per_scored


class MaskingSchedule:
    """What an objective with a ``masking`` (a :class:`MaskingConfig`) needs for a masking rate that
    moves over the run: ``scheduled`` and ``settings_at``."""

    masking: MaskingConfig

    @property
    def scheduled(self) -> bool:
        return self.masking.scheduled

    @contextmanager
    def settings_at(self, progress: float) -> Iterator[None]:
        fixed = self.masking
        self.masking = fixed.at(progress)
        try:
            yield
        finally:
            self.masking = fixed


class MaskedLM(MaskingSchedule, Objective):
    """A masked-LM objective: ``mask_rate`` of the tokens are predicted (whole words with
    ``whole_word``), of which ``mask_token_prob`` are shown as ``[MASK]``, ``random_token_prob`` as
    a random token and the rest unchanged. With ``mask_rate_start``, the rate moves linearly from it
    at the start of the run to ``mask_rate`` at its end (validation masks at ``mask_rate``). The head (dense, GELU, LayerNorm, decoder tied to the word embeddings) scores
    the masked positions only, and the encoder's last layer computes only those rows.

    Subclasses choose the examples (``example_builder``) and may add heads; ``forward`` of a plain
    masked LM is complete here."""

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str,
        mask_rate: float = 0.15,
        mask_token_prob: float = 0.8,
        random_token_prob: float = 0.1,
        whole_word: bool = False,
        mask_rate_start: float | None = None,
    ):
        super().__init__(encoder_config, tokens, name)
        self.masking = MaskingConfig(mask_rate, mask_token_prob, random_token_prob, whole_word, mask_rate_start)
        self.mlm_head = MaskedLMHead.for_encoder(encoder_config)

    def collator(self, length: int | None = None) -> MaskedLMCollator:
        return MaskedLMCollator(self.tokens, self.masking, length)

    def encoder_call(self, batch: Batch) -> EncoderCall | None:
        """The masked rows' last layer (and the pooled [CLS], when the encoder has a pooler)."""
        return EncoderCall(
            batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"], rows=batch["mlm_positions"]
        )

    def encode(self, encoder: Encoder, batch: Batch) -> EncoderOutput:
        """The encoder's output at the masked rows (and the pooled [CLS], when it has a pooler)."""
        call = self.encoder_call(batch)
        assert call is not None
        return call(encoder)

    def targets_per_sequence(self, max_seq_len: int) -> dict[str, float]:
        content = max_seq_len - 2  # [CLS] and [SEP] are never predicted
        rates = {"objective.mask_rate": self.masking.rate, "objective.mask_rate_start": self.masking.rate_start}
        return {f"{k}={r}": r * content for k, r in rates.items() if r is not None}

    def mlm_loss(self, out: EncoderOutput, encoder: Encoder, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, accuracy) over the masked positions, whose hidden states ``out`` holds as (batch,
        slots, hidden), laid out as ``batch["mlm_positions"]``."""
        return self.mlm_head.loss(out.hidden_states, encoder.word_embeddings.weight, batch["mlm_labels"])

    def loss_of(self, encoder: Encoder, batch: Batch, out: EncoderOutput) -> ObjectiveOutput:
        loss, acc = self.mlm_loss(out, encoder, batch)
        return ObjectiveOutput(loss, {"mlm_loss": loss.detach(), "mlm_acc": acc})

    def mlm_tally(self, out: EncoderOutput, encoder: Encoder, batch: Batch) -> Tally:
        """The MLM head's counts at the selected positions, by what the encoder was shown there."""
        weight = encoder.word_embeddings.weight
        shown = batch["input_ids"].gather(1, batch["mlm_positions"])
        return masked_tally(
            "mlm",
            lambda h: self.mlm_head.logits(h, weight),
            out.hidden_states,
            batch["mlm_labels"],
            shown,
            self.tokens.mask_id,
            weight.shape[0],
        )

    @torch.no_grad()
    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        return self.mlm_tally(self.encode(encoder, batch), encoder, batch)

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        metrics = masked_metrics("mlm", tally, self.token_counts)
        return metrics, [masked_check("MLM at [MASK]", "mlm", metrics)]

    @torch.no_grad()
    def sentence_scores(self, encoder: Encoder, sequences: list[np.ndarray], max_tokens: int = 8192) -> np.ndarray:
        """Pseudo-log-likelihood (Salazar et al., 2020): the sum, over the sequence's tokens ([CLS]
        and [SEP] excepted), of log p(token | the sequence with that token masked). Each token is
        masked in a copy of its own; copies of sequences of one length are stacked without padding,
        about ``max_tokens`` tokens at a time, and the encoder's last layer computes only the
        masked row of each copy."""
        device = encoder.word_embeddings.weight.device

        def logits(copies: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            copies[torch.arange(len(positions), device=device), positions] = self.tokens.mask_id
            hidden = encoder(copies, None, None, rows=positions[:, None]).hidden_states[:, 0]
            return self.mlm_head.logits(hidden, encoder.word_embeddings.weight)

        return pseudo_log_likelihood(sequences, self.tokens.special_ids, device, logits, max_tokens)

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        # the last layer runs at the masked rows only; the pooler and pair heads run once per sequence
        rate = self.masking.rate
        return flops_per_token(encoder_config, seq_len, rate) + mlm_head_flops(encoder_config, rate)

    @classmethod
    def hf_head(cls, state: dict[str, torch.Tensor], arch: str) -> tuple[str, dict[str, torch.Tensor]] | None:
        src = "objective.mlm_head."
        if f"{src}dense.weight" not in state or arch not in ("bert", "albert"):
            return None
        # BERT keeps the transform under cls.predictions.transform, ALBERT directly under predictions
        p, transform, head_class = {
            "bert": ("cls.predictions.", "cls.predictions.transform.", "BertForMaskedLM"),
            "albert": ("predictions.", "predictions.", "AlbertForMaskedLM"),
        }[arch]
        tensors = {
            f"{transform}{theirs}.{w}": state[f"{src}{ours}.{w}"]
            for ours, theirs in (("dense", "dense"), ("norm", "LayerNorm"))
            for w in ("weight", "bias")
        }
        tensors |= {
            f"{p}bias": state[f"{src}bias"],
            f"{p}decoder.bias": state[f"{src}bias"],
            f"{p}decoder.weight": state["encoder.embeddings.word_embeddings.weight"],
        }  # tied
        return head_class, tensors


__all__ = ["MaskedLM", "MaskedLMCollator", "MaskingSchedule", "mlm_head_flops"]
