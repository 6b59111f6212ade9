"""The objective plugin contract.

An objective owns what is specific to it: how examples are built from documents, how batches are
corrupted (in the collator, with an explicit generator), its heads and losses, and its metric
names. It never owns the encoder: ``forward`` receives it, so the encoder's weights live once, in
the LightningModule, and the exported encoder needs no objective code.

Adding an objective = one module here + one ``conf/objective/<name>.yaml`` whose ``_target_``
names the class. The YAML is the registry; there is no name -> class table.

    class MyObjective(Objective):
        def example_builder(self, max_seq_len) -> ExampleBuilder   # documents -> examples
        def collator(self) -> Collator                             # picklable, no weights
        def forward(self, encoder, batch) -> ObjectiveOutput       # loss + detached metrics
        def flops_per_token(self, encoder, seq_len) -> float       # for compute-matched runs
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
import torch
from torch import nn

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.model.heads import MaskedLMHead
from pretrainlab.objectives.masking import MaskingConfig, corrupt, select_tokens
from pretrainlab.objectives.pairs import Example, ExampleBuilder
from pretrainlab.tokens import SpecialTokens

Batch = dict[str, torch.Tensor]


@dataclass
class ObjectiveOutput:
    """``loss`` drives the optimiser; ``metrics`` (detached scalars) are logged as ``stage/name``."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class Collator(Protocol):
    """Turns a list of examples into a batch; all randomness comes from ``generator``."""

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch: ...


class Objective(nn.Module):
    """Base class of objective plugins. Subclasses call ``super().__init__(encoder_config, tokens, name)``.

    ``uses_pooler``: whether the loss goes through the encoder's pooled [CLS] output. When it does
    not, the pooler is frozen during pretraining (DDP requires every trained parameter to get a
    gradient) and fine-tuning trains it from its initialisation.
    """

    uses_pooler: bool = False

    def __init__(self, encoder_config: EncoderConfig, tokens: SpecialTokens, name: str):
        super().__init__()
        self.encoder_config = encoder_config
        self.tokens = tokens
        self.name = name

    def example_builder(self, max_seq_len: int) -> ExampleBuilder:
        raise NotImplementedError

    def collator(self) -> Collator:
        raise NotImplementedError

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        raise NotImplementedError

    def flops_per_token(self, encoder: Encoder, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per input token. Default: the encoder alone."""
        return encoder.flops_per_token(seq_len)


# ---------------------------------------------------------------------------------------------
# Pieces shared by the masked-LM objectives (RoBERTa, BERT, ALBERT; ELECTRA's generator).


def pad_examples(examples: list[Example], pad_id: int, pad_to_multiple_of: int = 8) -> Batch:
    """Stack variable-length examples right-padded; adds ``attention_mask`` and ``n_tokens``."""
    longest = max(len(e["input_ids"]) for e in examples)
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    types = np.zeros((len(examples), width), dtype=np.int64)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = e["input_ids"]
        if "token_type_ids" in e:
            types[i, :n] = e["token_type_ids"]
    batch = {"input_ids": torch.from_numpy(ids)}
    batch["attention_mask"] = batch["input_ids"] != pad_id
    if "token_type_ids" in examples[0]:
        batch["token_type_ids"] = torch.from_numpy(types)
    if "label" in examples[0]:
        batch["labels"] = torch.tensor([int(e["label"]) for e in examples], dtype=torch.long)
    batch["n_tokens"] = batch["attention_mask"].sum()
    return batch


@dataclass(frozen=True, eq=False)
class MaskedLMCollator:
    """Pads, then selects ~rate of the non-special tokens and corrupts them (80/10/10).

    Masks are drawn anew every time an example is seen (dynamic masking, as RoBERTa). The batch
    carries the flat positions and original ids of the selected tokens, so the head scores only
    those (sparse prediction).
    """

    tokens: SpecialTokens
    masking: MaskingConfig

    @cached_property
    def random_candidates(self) -> torch.Tensor:
        return torch.from_numpy(self.tokens.random_candidates())

    def eligible(self, input_ids: torch.Tensor) -> torch.Tensor:
        special = torch.zeros_like(input_ids, dtype=torch.bool)
        for i in self.tokens.special_ids:
            special |= input_ids == i
        return ~special

    def select(self, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        return select_tokens(self.eligible(batch["input_ids"]), self.masking.rate, generator)

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        batch = pad_examples(examples, self.tokens.pad_id)
        selected = self.select(batch, generator)
        original = batch["input_ids"]
        batch["input_ids"] = corrupt(
            original, selected, self.masking, self.tokens.mask_id, self.random_candidates, generator
        )
        batch["mlm_positions"] = selected.flatten().nonzero().squeeze(1)
        batch["mlm_labels"] = original.flatten()[batch["mlm_positions"]]
        return batch


def masked_lm_loss(
    head: MaskedLMHead, masked_hidden: torch.Tensor, word_embeddings: torch.Tensor, batch: Batch
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, accuracy) of the masked positions only; ``masked_hidden`` holds their hidden states,
    in the order of ``batch["mlm_positions"]`` (``encoder(..., rows=mlm_positions)``)."""
    return head.loss(masked_hidden, word_embeddings, batch["mlm_labels"])


def mlm_head_flops(encoder_config: EncoderConfig, mask_rate: float) -> float:
    """Training FLOPs per input token of a sparse, tied MLM head (only mask_rate of tokens scored)."""
    c = encoder_config
    per_scored = 2 * (c.hidden_size * c.embedding_size + c.embedding_size * c.vocab_size)
    return 3.0 * mask_rate * per_scored
