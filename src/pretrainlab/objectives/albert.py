"""ALBERT (Lan et al., 2020): n-gram masking of whole words + sentence-order prediction.

ALBERT's architecture (factorised embeddings, cross-layer sharing) is a model preset
(``model=albert_base``), not part of the objective: the objective runs on any encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import EncoderConfig
from pretrainlab.objectives.base import Batch
from pretrainlab.objectives.bert import BERT
from pretrainlab.objectives.masked_lm import MaskedLMCollator
from pretrainlab.objectives.masking import select_ngrams
from pretrainlab.tokens import SpecialTokens

PAIR_TASKS = ("sop", "nsp")


@dataclass(frozen=True, eq=False)
class NgramMaskingCollator(MaskedLMCollator):
    """Selects n-gram spans of whole words (p(n) proportional to 1/n, n <= max_ngram) up to the
    number of tokens to predict (mask_rate of the eligible ones); the 80/10/10 corruption is then
    drawn per token."""

    max_ngram: int = 3

    def select(self, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        ids = batch["input_ids"]
        continuation = torch.from_numpy(self.tokens.is_continuation)[ids]
        return select_ngrams(self.eligible(ids), continuation, self.masking.rate, self.max_ngram, generator)


class ALBERT(BERT):
    """MLM with n-gram masking + SOP: A and B are consecutive segments, swapped half the time.

    ``pair_task="nsp"`` trains BERT's next-sentence prediction instead, on the same masking: the
    NSP row of ALBERT's Table 5 (none / NSP / SOP on one encoder)."""

    pair_task = "sop"

    def __init__(
        self,
        encoder_config: EncoderConfig,
        tokens: SpecialTokens,
        name: str = "albert",
        max_ngram: int = 3,
        pair_task: str = "sop",
        **kwargs,
    ):
        if pair_task not in PAIR_TASKS:
            raise ConfigError(
                f"objective.pair_task={pair_task!r} is not a pair task: choose sop (sentence order, ALBERT's) or nsp "
                f"(next sentence, BERT's)."
            )
        self.pair_task = pair_task
        super().__init__(encoder_config, tokens, name, **kwargs)
        if max_ngram < 1:
            raise ValueError(f"objective.max_ngram must be at least 1, got {max_ngram}.")
        self.max_ngram = max_ngram

    def collator(self, length: int | None = None) -> NgramMaskingCollator:
        return NgramMaskingCollator(self.tokens, self.masking, length, max_ngram=self.max_ngram)
