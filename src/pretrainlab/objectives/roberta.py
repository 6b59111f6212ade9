"""RoBERTa (Liu et al., 2019): masked LM only, dynamic masking, full-sentence packing, no NSP."""

from __future__ import annotations

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.model.heads import MaskedLMHead
from pretrainlab.objectives.base import (
    Batch, MaskedLMCollator, Objective, ObjectiveOutput, masked_lm_loss, mlm_head_flops,
)
from pretrainlab.objectives.masking import MaskingConfig
from pretrainlab.objectives.pairs import PackedBlocks
from pretrainlab.tokens import SpecialTokens


class RoBERTa(Objective):
    """Masked-LM on packed blocks of whole sentences that may cross document boundaries."""

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "roberta",
        mask_rate: float = 0.15,
        mask_token_prob: float = 0.8,
        random_token_prob: float = 0.1,
    ):
        super().__init__(encoder_config, tokens, name)
        self.masking = MaskingConfig(mask_rate, mask_token_prob, random_token_prob)
        c = encoder_config
        self.mlm_head = MaskedLMHead(c.hidden_size, c.embedding_size, c.vocab_size, c.layer_norm_eps)

    def example_builder(self, max_seq_len: int) -> PackedBlocks:
        return PackedBlocks(max_seq_len, self.tokens.cls_id, self.tokens.sep_id)

    def collator(self) -> MaskedLMCollator:
        return MaskedLMCollator(self.tokens, self.masking)

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        out = encoder(batch["input_ids"], attention_mask=batch["attention_mask"], rows=batch["mlm_positions"])
        word_embeddings = encoder.embeddings.word_embeddings.weight
        loss, acc = masked_lm_loss(self.mlm_head, out.hidden_states, word_embeddings, batch)
        return ObjectiveOutput(loss, {"mlm_loss": loss.detach(), "mlm_acc": acc})

    def flops_per_token(self, encoder: Encoder, seq_len: int) -> float:
        return encoder.flops_per_token(seq_len, self.masking.rate) + mlm_head_flops(self.encoder_config, self.masking.rate)
