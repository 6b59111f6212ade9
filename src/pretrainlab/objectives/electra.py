"""ELECTRA (Clark et al., 2020): replaced-token detection.

A small generator (same depth, ``generator_scale`` x the width) is trained as a masked LM and
fills the masked positions with tokens sampled from its own distribution; the discriminator (the
shared encoder, which is what gets exported) predicts, for every non-padding token, whether it was
replaced. Generator and discriminator share the token, position and segment embeddings, which live
in the discriminator; the generator's MLM head is tied to them.

    loss = gen_weight x generator MLM loss + disc_weight x discriminator loss (default 1 and 50)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pretrainlab.data.examples import Example
from pretrainlab.data.packing import PackedBlocks
from pretrainlab.model.encoder import Encoder, EncoderConfig, flops_per_token
from pretrainlab.model.heads import IGNORE, MaskedLMHead, TokenHead
from pretrainlab.objectives.base import Batch, Objective, ObjectiveOutput, by_length, loss_weight
from pretrainlab.objectives.learning import (
    HeadCheck,
    Tally,
    detection_check,
    detection_metrics,
    detection_tally,
    masked_check,
    masked_metrics,
    masked_tally,
)
from pretrainlab.objectives.masked_lm import MaskedLMCollator, MaskingSchedule, mlm_head_flops
from pretrainlab.objectives.masking import MaskingConfig
from pretrainlab.tokens import SpecialTokens


@dataclass(frozen=True, eq=False)
class ElectraCollator(MaskedLMCollator):
    """Masks like the MLM collator and adds ``sample_uniform`` (batch, slots): the uniform number
    at which the generator's distribution is sampled for each masked position, so replacements too
    come from the batch's explicit randomness, the same on every device."""

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        batch = super().__call__(examples, generator)
        batch["sample_uniform"] = torch.rand(batch["mlm_positions"].shape, generator=generator, dtype=torch.float64)
        return batch


class ELECTRA(MaskingSchedule, Objective):
    """Replaced-token detection by the shared encoder (exported as a transformers ELECTRA
    discriminator), with a masked-LM generator of ``generator_scale`` x its width."""

    hf_model_type = "electra"

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "electra",
        mask_rate: float = 0.15,
        mask_token_prob: float = 0.85,
        random_token_prob: float = 0.0,
        whole_word: bool = False,
        mask_rate_start: float | None = None,
        generator_scale: float = 0.25,
        gen_weight: float = 1.0,
        disc_weight: float = 50.0,
        temperature: float = 1.0,
    ):
        super().__init__(encoder_config, tokens, name)
        if not 0.0 < generator_scale <= 1.0:
            raise ValueError(f"objective.generator_scale must be in (0, 1], got {generator_scale}.")
        if temperature <= 0:
            raise ValueError(f"objective.temperature must be positive, got {temperature}.")
        self.masking = MaskingConfig(mask_rate, mask_token_prob, random_token_prob, whole_word, mask_rate_start)
        self.gen_weight = loss_weight("gen_weight", gen_weight, name)
        self.disc_weight = loss_weight("disc_weight", disc_weight, name)
        self.temperature = temperature
        self.generator_scale = generator_scale
        self.generator_config = encoder_config.scaled(generator_scale)
        g = self.generator_config
        self.generator = Encoder(g, own_embeddings=False)
        self.generator_head = MaskedLMHead.for_encoder(g)
        self.discriminator_head = TokenHead(encoder_config.hidden_size)

    def targets_per_sequence(self, max_seq_len: int) -> dict[str, float]:  # the generator's masked tokens
        rates = {"objective.mask_rate": self.masking.rate, "objective.mask_rate_start": self.masking.rate_start}
        return {f"{k}={r}": r * (max_seq_len - 2) for k, r in rates.items() if r is not None}

    def example_builder(self, max_seq_len: int) -> PackedBlocks:
        return PackedBlocks(max_seq_len, self.tokens.cls_id, self.tokens.sep_id)

    def collator(self, length: int | None = None) -> ElectraCollator:
        return ElectraCollator(self.tokens, self.masking, length)

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        ids, types, attention = batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"]
        positions, originals = batch["mlm_positions"], batch["mlm_labels"]  # (batch, slots)
        word_embeddings = encoder.word_embeddings.weight

        # generator: masked LM on the corrupted input, through the shared embeddings, and one sample
        # from it at each masked position (no gradient flows through the sample)
        gen = self.generator(ids, types, attention, embeddings=encoder.embeddings, rows=positions)
        gen_loss, gen_acc, sampled = self.generator_head.loss(
            gen.hidden_states, word_embeddings, originals, self.temperature, batch["sample_uniform"]
        )
        disc_ids, replaced = self.replace(ids, positions, originals, sampled)

        # discriminator: replaced or original, for every non-padding token
        disc = encoder(disc_ids, types, attention)
        disc_logits = self.discriminator_head(disc.hidden_states).float()
        real = attention.float()
        n_real = real.sum()
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits, replaced, weight=real, reduction="sum") / n_real

        loss = self.gen_weight * gen_loss + self.disc_weight * disc_loss
        with torch.no_grad():
            pred = (disc_logits > 0).float() * real
            target = replaced * real
            tp = (pred * target).sum()
            metrics = {
                "gen_mlm_loss": gen_loss.detach(),
                "gen_mlm_acc": gen_acc,
                "rtd_loss": disc_loss.detach(),
                "rtd_acc": (((pred == target).float() * real).sum() / n_real),
                "rtd_precision": tp / pred.sum().clamp(min=1),
                "rtd_recall": tp / target.sum().clamp(min=1),
                "replaced_frac": target.sum() / n_real,
            }
        return ObjectiveOutput(loss, metrics)

    @staticmethod
    @torch.no_grad()
    def replace(
        ids: torch.Tensor, positions: torch.Tensor, originals: torch.Tensor, sampled: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The discriminator's input (the generator's samples at the masked positions) and its
        target (1.0 where a token was replaced; a sample equal to the original is "original")."""
        scored = originals != IGNORE  # empty slots point at [CLS] and change nothing
        disc_ids = ids.scatter(1, positions, torch.where(scored, sampled, ids.gather(1, positions)))
        replaced = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device).scatter(
            1, positions, (scored & (sampled != originals)).float()
        )
        return disc_ids, replaced

    @torch.no_grad()
    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        """The generator's counts at the masked positions and the discriminator's on the text the
        generator's samples make, as in training."""
        ids, types, attention = batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"]
        positions, originals = batch["mlm_positions"], batch["mlm_labels"]
        weight = encoder.word_embeddings.weight
        gen = self.generator(ids, types, attention, embeddings=encoder.embeddings, rows=positions)
        _, _, sampled = self.generator_head.loss(
            gen.hidden_states, weight, originals, self.temperature, batch["sample_uniform"]
        )
        head = self.generator_head
        counts = masked_tally(
            "gen",
            lambda h: head.logits(h, weight),
            gen.hidden_states,
            originals,
            ids.gather(1, positions),
            self.tokens.mask_id,
            weight.shape[0],
        )
        disc_ids, replaced = self.replace(ids, positions, originals, sampled)
        logits = self.discriminator_head(encoder(disc_ids, types, attention).hidden_states)
        return counts | detection_tally("rtd", logits, replaced, attention, disc_ids, weight.shape[0])

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        gen, rtd = masked_metrics("gen", tally, self.token_counts), detection_metrics("rtd", tally)
        return gen | rtd, [
            detection_check("replaced-token detection", "rtd", rtd),
            masked_check("generator at [MASK]", "gen", gen),
        ]

    @torch.no_grad()
    def sentence_scores(self, encoder: Encoder, sequences: list[np.ndarray], max_tokens: int = 8192) -> np.ndarray:
        """The discriminator's log-probability that every token is original: the sum, over the
        sequence's tokens ([CLS] and [SEP] excepted), of log(1 - sigmoid(logit)) = -softplus(logit).
        One forward per sequence; sequences of one length are stacked without padding."""
        device = encoder.word_embeddings.weight.device
        special = torch.tensor(sorted(self.tokens.special_ids), device=device)
        scores = np.zeros(len(sequences), dtype=np.float64)
        for length, members in by_length(sequences).items():
            step = max(1, max_tokens // length)
            for start in range(0, len(members), step):
                chunk = members[start : start + step]
                ids = torch.as_tensor(np.stack([sequences[i] for i in chunk]), dtype=torch.long, device=device)
                logits = self.discriminator_head(encoder(ids, None, None).hidden_states).double()
                original = -F.softplus(logits) * (~torch.isin(ids, special))
                scores[chunk] = original.sum(dim=1).cpu().numpy()
        return scores

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        # discriminator encoder + its per-token head, generator encoder + its sparse MLM head
        h = encoder_config.hidden_size
        disc_head = 3.0 * 2 * (h * h + h)
        g, rate = encoder_config.scaled(self.generator_scale), self.masking.rate
        generator = flops_per_token(g, seq_len, rate) + mlm_head_flops(g, rate)
        return flops_per_token(encoder_config, seq_len) + disc_head + generator

    @classmethod
    def hf_head(cls, state: dict[str, torch.Tensor], arch: str) -> tuple[str, dict[str, torch.Tensor]] | None:
        src = "objective.discriminator_head."
        if f"{src}dense.weight" not in state or arch != "electra":
            return None
        p = "discriminator_predictions."
        return "ElectraForPreTraining", {f"{p}dense.{w}": state[f"{src}dense.{w}"] for w in ("weight", "bias")} | {
            f"{p}dense_prediction.{w}": state[f"{src}out.{w}"] for w in ("weight", "bias")
        }


__all__ = ["ELECTRA", "ElectraCollator"]
