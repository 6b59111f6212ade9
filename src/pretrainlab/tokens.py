"""What objectives need to know about a vocabulary: the special tokens' roles and ids, and word
boundaries. This module owns the roles: every other one takes them from here.

    ROLES           pad, unk, cls, sep, mask
    SPECIALS        BERT's strings for them ([PAD], [UNK], ...), the default
    SpecialTokens   their ids in one tokenizer, and which ids continue a word
    special_tokens  SpecialTokens of a ``tokenizers.Tokenizer``
    with_template   a copy of a tokenizer that adds [CLS] ... [SEP] (... [SEP]) when encoding
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers, processors

ROLES = ("pad", "unk", "cls", "sep", "mask")
SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


@dataclass(frozen=True, eq=False)
class SpecialTokens:
    """Special token ids of a tokenizer, plus which ids continue a word.

    ``is_continuation[i]`` is True when token ``i`` is a piece inside a word (WordPiece ``##x``;
    a byte-level BPE piece without the leading-space marker). Whole-word and n-gram masking use it
    so that a span never splits a word.
    """

    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray = field(repr=False)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(self.ids().values())

    def ids(self) -> dict[str, int]:
        """Role -> id, for every role of :data:`ROLES`."""
        return {role: getattr(self, f"{role}_id") for role in ROLES}

    def random_candidates(self) -> np.ndarray:
        """Ids a random replacement may take: every id but the special ones."""
        keep = np.ones(self.vocab_size, dtype=bool)
        keep[list(self.special_ids)] = False
        return np.flatnonzero(keep)


def special_tokens(tok: Tokenizer, names: dict | None = None) -> SpecialTokens:
    """Special ids and the continuation-piece table of a tokenizer."""
    names = {**SPECIALS, **(names or {})}
    ids = {}
    for role, token in names.items():
        i = tok.token_to_id(token)
        if i is None:
            raise ValueError(
                f"the tokenizer has no {role} token {token!r}; set tokenizer.special_tokens.{role} "
                f"to the string it uses."
            )
        ids[role] = i
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    continuation = np.zeros(vocab_size, dtype=bool)
    model = json.loads(tok.to_str())["model"]
    for token, i in tok.get_vocab(with_added_tokens=True).items():
        if model["type"] == "WordPiece":
            continuation[i] = token.startswith(model.get("continuing_subword_prefix", "##"))
        elif model["type"] == "BPE" and isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel):
            continuation[i] = not token.startswith("\u0120")  # 'Ġ' marks a word start
    continuation[[ids[r] for r in ids]] = False
    return SpecialTokens(
        vocab_size=vocab_size,
        pad_id=ids["pad"],
        unk_id=ids["unk"],
        cls_id=ids["cls"],
        sep_id=ids["sep"],
        mask_id=ids["mask"],
        is_continuation=continuation,
    )


def with_template(tokenizer: Tokenizer, cls: str = SPECIALS["cls"], sep: str = SPECIALS["sep"]) -> Tokenizer:
    """A copy of ``tokenizer`` whose ``encode(a)`` / ``encode(a, b)`` add ``[CLS] a [SEP]`` /
    ``[CLS] a [SEP] b [SEP]`` with segment ids 0/1, as the encoder saw its inputs in pretraining
    and fine-tuning (and as its pooled [CLS] output needs). ``add_special_tokens=False`` still
    encodes the text alone."""
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )
    return tok
