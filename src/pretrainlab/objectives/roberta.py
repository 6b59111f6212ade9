"""RoBERTa (Liu et al., 2019): masked LM only, dynamic masking, full-sentence packing, no NSP."""

from __future__ import annotations

from pretrainlab.data.packing import PackedBlocks
from pretrainlab.objectives.masked_lm import MaskedLM


class RoBERTa(MaskedLM):
    """Masked-LM on packed blocks of whole sentences that may cross document boundaries."""

    def __init__(self, encoder_config, tokens, name: str = "roberta", **masking):
        super().__init__(encoder_config, tokens, name, **masking)

    def example_builder(self, max_seq_len: int) -> PackedBlocks:
        return PackedBlocks(max_seq_len, self.tokens.cls_id, self.tokens.sep_id)
