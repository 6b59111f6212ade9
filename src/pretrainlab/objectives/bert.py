"""BERT (Devlin et al., 2019): masked LM + next-sentence prediction on sentence pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pretrainlab.config import ConfigError
from pretrainlab.data.sentence_pairs import UNITS, SentencePairs
from pretrainlab.model.encoder import Encoder, EncoderConfig, EncoderOutput
from pretrainlab.model.heads import PairHead
from pretrainlab.objectives.base import Batch, ObjectiveOutput, loss_weight
from pretrainlab.objectives.learning import HeadCheck, Tally, pair_check, pair_metrics, pair_tally
from pretrainlab.objectives.masked_lm import MaskedLM
from pretrainlab.tokens import SpecialTokens


class BERT(MaskedLM):
    """``[CLS] A [SEP] B [SEP]`` pairs; loss = MLM + pair loss on the pooled [CLS] (dense + tanh).

    The pair task is next-sentence prediction here (label 1: B is from another document);
    ALBERT reuses this class with sentence-order prediction. ``pair_unit``: what A and B are,
    segments of sentences filling the sequence (``segments``, RoBERTa's SEGMENT-PAIR) or one
    sentence each (``sentences``, SENTENCE-PAIR; Liu et al., 2019, Table 2).
    """

    uses_pooler = True

    pair_task = "nsp"

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "bert",
        short_seq_prob: float = 0.1,
        pair_weight: float = 1.0,
        pair_unit: str = "segments",
        **masking,
    ):
        if not encoder_config.add_pooler:
            raise ConfigError(
                f"objective={name} predicts {self.pair_task.upper()} from the pooled [CLS] vector: set "
                f"model.add_pooler=true."
            )
        if pair_unit not in UNITS:
            raise ConfigError(
                f"objective.pair_unit={pair_unit!r} is not a pair unit: choose segments (A and B fill the sequence "
                f"with whole sentences) or sentences (one sentence each)."
            )
        super().__init__(encoder_config, tokens, name, **masking)
        self.pair_unit = pair_unit
        self.short_seq_prob, self.pair_weight = short_seq_prob, loss_weight("pair_weight", pair_weight, name)
        self.pair_head = PairHead(encoder_config.hidden_size)

    def example_builder(self, max_seq_len: int) -> SentencePairs:
        return SentencePairs(
            max_seq_len, self.tokens.cls_id, self.tokens.sep_id, self.pair_task, self.short_seq_prob, self.pair_unit
        )

    def loss_of(self, encoder: Encoder, batch: Batch, out: EncoderOutput) -> ObjectiveOutput:
        mlm_loss, mlm_acc = self.mlm_loss(out, encoder, batch)
        pair_logits = self.pair_head(out.pooled).float()
        pair_loss = F.cross_entropy(pair_logits, batch["labels"])
        pair_acc = (pair_logits.detach().argmax(-1) == batch["labels"]).float().mean()
        t = self.pair_task
        return ObjectiveOutput(
            mlm_loss + self.pair_weight * pair_loss,
            {"mlm_loss": mlm_loss.detach(), "mlm_acc": mlm_acc, f"{t}_loss": pair_loss.detach(), f"{t}_acc": pair_acc},
        )

    @torch.no_grad()
    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        out = self.encode(encoder, batch)
        return self.mlm_tally(out, encoder, batch) | pair_tally(
            self.pair_task, self.pair_head(out.pooled).float(), batch["labels"]
        )

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        """The masked LM's check and the pair head's; with ``pair_weight=0`` the pair head has no loss, so its
        scores are reported (the chance row of a pair-loss ablation) and not judged."""
        metrics, checks = super().learning(tally)
        pair = pair_metrics(self.pair_task, tally)
        if self.pair_weight == 0:
            return metrics | pair, checks
        return metrics | pair, [*checks, pair_check(self.pair_task.upper(), self.pair_task, pair)]
