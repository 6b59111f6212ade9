"""What objectives need to know about a vocabulary: special ids and word boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    def random_candidates(self) -> np.ndarray:
        """Ids a random replacement may take: every id but the special ones."""
        keep = np.ones(self.vocab_size, dtype=bool)
        keep[list(self.special_ids)] = False
        return np.flatnonzero(keep)
