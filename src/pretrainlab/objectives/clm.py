"""Causal language modelling on the shared encoder: next-token prediction under a causal mask, the
encoder then fine-tuned bidirectionally like every other (the setting of Gisserot-Boukhlef et al.,
2025, "Should We Still Pretrain Encoders with Masked Language Modeling?").

Every position predicts the token after it from itself and the positions before it: the encoder
runs once with a causal attention pattern (``Encoder.forward`` takes any pattern), on blocks of
whole sentences as RoBERTa's (no corruption, no ``[MASK]``). Every real position but the last is
scored, through the masked LMs' head (dense, GELU, LayerNorm, decoder tied to the word embeddings),
so that a comparison changes the objective alone. The exported encoder is the same encoder;
fine-tuning and every evaluation run it without the causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pretrainlab.data.examples import Example
from pretrainlab.model.encoder import Encoder, EncoderCall, EncoderConfig, flops_per_token
from pretrainlab.model.heads import IGNORE, MaskedLMHead
from pretrainlab.objectives.autoregressive import Autoregressive
from pretrainlab.objectives.base import Batch, by_length, pad_examples
from pretrainlab.objectives.masked_lm import mlm_head_flops
from pretrainlab.tokens import SpecialTokens


def causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, seq) bool: each query row sees the real keys not after it."""
    t = attention_mask.shape[1]
    earlier = torch.ones(t, t, dtype=torch.bool, device=attention_mask.device).tril()
    return earlier[None] & attention_mask.bool()[:, None, :]


def next_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq): each position's label, the token after it; ``IGNORE`` where there is none (the
    last real position, padding)."""
    labels = torch.full_like(input_ids, IGNORE)
    has_next = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    labels[:, :-1] = torch.where(has_next, input_ids[:, 1:], IGNORE)
    return labels


@dataclass(frozen=True, eq=False)
class CausalCollator:
    """Pads; ``clm_labels`` holds each position's next token (``IGNORE`` where none)."""

    tokens: SpecialTokens
    length: int | None = None

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch:
        batch = pad_examples(examples, self.tokens.pad_id, length=self.length)
        batch["clm_labels"] = next_tokens(batch["input_ids"], batch["attention_mask"])
        return batch


class CausalLM(Autoregressive):
    """Next-token prediction under a causal mask (see the module docstring)."""

    prefix, check_name, where = "clm", "next token", "the next token"

    # the head is exported with the encoder's weights only: transformers' nearest class, BertLMHeadModel
    # (is_decoder=True), is not mapped
    hf_head_class = False

    def __init__(self, encoder_config: EncoderConfig, tokens: SpecialTokens, name: str = "clm"):
        super().__init__(encoder_config, tokens, name)
        self.lm_head = MaskedLMHead.for_encoder(encoder_config)

    def collator(self, length: int | None = None) -> CausalCollator:
        return CausalCollator(self.tokens, length)

    def encoder_call(self, batch: Batch) -> EncoderCall:
        return EncoderCall(batch["input_ids"], None, causal_mask(batch["attention_mask"]))

    @torch.no_grad()
    def sentence_scores(self, encoder: Encoder, sequences: list[np.ndarray], max_tokens: int = 8192) -> np.ndarray:
        """The sequence's log-likelihood left to right: the sum of log p(token | the tokens before it)
        over its tokens after [CLS], [SEP] excepted. One causal forward per sequence."""
        device = encoder.word_embeddings.weight.device
        special = torch.tensor(sorted(self.tokens.special_ids), device=device)
        scores = torch.zeros(len(sequences), dtype=torch.float64, device=device)
        for length, members in by_length(sequences).items():
            ids = torch.as_tensor(np.stack([sequences[i] for i in members]), dtype=torch.long, device=device)
            step = max(1, max_tokens // length)
            for start in range(0, len(members), step):
                x = ids[start : start + step]
                real = torch.ones_like(x, dtype=torch.bool)
                hidden = encoder(x, None, causal_mask(real)).hidden_states[:, :-1]
                logits = self.lm_head.logits(hidden, encoder.word_embeddings.weight)
                logp = torch.log_softmax(logits.float(), dim=-1).gather(2, x[:, 1:, None]).squeeze(2)
                logp = logp.masked_fill(torch.isin(x[:, 1:], special), 0.0)
                scores[torch.as_tensor(members[start : start + step], device=device)] = logp.double().sum(1)
        return scores.cpu().numpy()

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        """The encoder at every row (the causal mask saves no arithmetic in the kernels used) and the
        head at every position."""
        return flops_per_token(encoder_config, seq_len) + mlm_head_flops(encoder_config, 1.0)


__all__ = ["CausalCollator", "CausalLM", "causal_mask", "next_tokens"]
