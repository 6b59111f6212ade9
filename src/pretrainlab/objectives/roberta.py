"""RoBERTa (Liu et al., 2019): masked LM only, dynamic masking, full-sentence packing, no NSP."""

from __future__ import annotations

from pretrainlab.data.packing import PackedBlocks
from pretrainlab.objectives.masked_lm import MaskedLM


class RoBERTa(MaskedLM):
    """Masked-LM on packed blocks of whole sentences that may cross document boundaries
    (FULL-SENTENCES); with ``cross_documents=False``, a block ends where its document ends
    (DOC-SENTENCES; Liu et al., 2019, Table 2)."""

    def __init__(self, encoder_config, tokens, name: str = "roberta", cross_documents: bool = True, **masking):
        super().__init__(encoder_config, tokens, name, **masking)
        self.cross_documents = bool(cross_documents)

    def example_builder(self, max_seq_len: int) -> PackedBlocks:
        return PackedBlocks(max_seq_len, self.tokens.cls_id, self.tokens.sep_id, self.cross_documents)
