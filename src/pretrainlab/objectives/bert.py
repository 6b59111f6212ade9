"""BERT (Devlin et al., 2019): masked LM + next-sentence prediction on sentence pairs."""

from __future__ import annotations

import torch.nn.functional as F

from pretrainlab.model.encoder import ConfigError, Encoder, EncoderConfig
from pretrainlab.model.heads import MaskedLMHead, PairHead
from pretrainlab.objectives.base import (
    Batch, MaskedLMCollator, Objective, ObjectiveOutput, masked_lm_loss, mlm_head_flops,
)
from pretrainlab.objectives.masking import MaskingConfig
from pretrainlab.objectives.pairs import SentencePairs
from pretrainlab.tokens import SpecialTokens


class BERT(Objective):
    """``[CLS] A [SEP] B [SEP]`` pairs; loss = MLM + pair loss on the pooled [CLS] (dense + tanh).

    The pair task is next-sentence prediction here (label 1: B is from another document);
    ALBERT reuses this class with sentence-order prediction.
    """

    uses_pooler = True

    pair_task = "nsp"

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "bert",
        mask_rate: float = 0.15,
        mask_token_prob: float = 0.8,
        random_token_prob: float = 0.1,
        short_seq_prob: float = 0.1,
        pair_weight: float = 1.0,
    ):
        super().__init__(encoder_config, tokens, name)
        if not encoder_config.add_pooler:
            raise ConfigError(
                f"objective={name} predicts {self.pair_task.upper()} from the pooled [CLS] vector: set model.add_pooler=true."
            )
        self.masking = MaskingConfig(mask_rate, mask_token_prob, random_token_prob)
        self.short_seq_prob, self.pair_weight = short_seq_prob, pair_weight
        c = encoder_config
        self.mlm_head = MaskedLMHead(c.hidden_size, c.embedding_size, c.vocab_size, c.layer_norm_eps)
        self.pair_head = PairHead(c.hidden_size)

    def example_builder(self, max_seq_len: int) -> SentencePairs:
        return SentencePairs(max_seq_len, self.tokens.cls_id, self.tokens.sep_id, self.pair_task, self.short_seq_prob)

    def collator(self) -> MaskedLMCollator:
        return MaskedLMCollator(self.tokens, self.masking)

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        out = encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], rows=batch["mlm_positions"])
        word_embeddings = encoder.embeddings.word_embeddings.weight
        mlm_loss, mlm_acc = masked_lm_loss(self.mlm_head, out.hidden_states, word_embeddings, batch)
        pair_logits = self.pair_head(out.pooled).float()
        pair_loss = F.cross_entropy(pair_logits, batch["labels"])
        pair_acc = (pair_logits.detach().argmax(-1) == batch["labels"]).float().mean()
        t = self.pair_task
        return ObjectiveOutput(
            mlm_loss + self.pair_weight * pair_loss,
            {"mlm_loss": mlm_loss.detach(), "mlm_acc": mlm_acc, f"{t}_loss": pair_loss.detach(), f"{t}_acc": pair_acc},
        )

    def flops_per_token(self, encoder: Encoder, seq_len: int) -> float:
        # the pooler and pair head run once per sequence: negligible per token
        return encoder.flops_per_token(seq_len, self.masking.rate) + mlm_head_flops(self.encoder_config, self.masking.rate)
