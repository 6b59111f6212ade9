"""What objectives need to know about a vocabulary: the special tokens' roles and ids, and word
boundaries. This module owns the roles: every other one takes them from here.

    ROLES           pad, unk, cls, sep, mask
    SPECIALS        BERT's strings for them ([PAD], [UNK], ...), the default
    SpecialTokens   their ids in one tokenizer, and which ids continue a word
    special_tokens  SpecialTokens of a ``tokenizers.Tokenizer``
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

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
    return SpecialTokens(vocab_size=vocab_size, pad_id=ids["pad"], unk_id=ids["unk"], cls_id=ids["cls"],
                         sep_id=ids["sep"], mask_id=ids["mask"], is_continuation=continuation)
