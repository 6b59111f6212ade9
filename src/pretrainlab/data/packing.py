"""RoBERTa's FULL-SENTENCES examples: contiguous sentences packed into blocks of up to
``max_seq_len`` tokens, crossing document boundaries with an extra separator (or, as DOC-SENTENCES,
ending a block where its document ends)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pretrainlab.data.examples import Documents, Example, ExampleBuilder, as_documents


@dataclass(frozen=True)
class PackedBlocks(ExampleBuilder):
    """``[CLS] s1 s2 ... [SEP]`` blocks of whole contiguous sentences, at most ``max_len`` tokens.

    With ``cross_documents`` (RoBERTa's FULL-SENTENCES), blocks run across documents; where one
    document ends and the next begins inside a block, an extra ``[SEP]`` marks the boundary. Without
    it (DOC-SENTENCES), a block ends where its document ends, so the last block of a document may
    be short. A sentence longer than a block is cut into block-sized pieces. No token is dropped or
    repeated, so the packed corpus is the corpus.
    """

    max_len: int
    cls_id: int
    sep_id: int
    cross_documents: bool = True

    def __call__(
        self, documents: Documents | Sequence[Sequence[np.ndarray]], rng: np.random.Generator | None = None
    ) -> Iterator[Example]:
        documents = as_documents(documents)
        room = self.max_len - 2
        if room < 1:
            raise ValueError(f"max_seq_len={self.max_len} leaves no room for tokens between [CLS] and [SEP].")
        sep = np.array([self.sep_id], dtype=np.int32)
        pieces: list[np.ndarray] = []
        used = 0

        def emit() -> Example:
            ids = np.concatenate([[self.cls_id], *pieces, [self.sep_id]]).astype(np.int32)
            return {"input_ids": ids}

        for d, doc in enumerate(documents):
            if d > 0 and used > 0:
                if not self.cross_documents:  # DOC-SENTENCES: a document's end ends its block
                    yield emit()
                    pieces, used = [], 0
                elif used + 1 < room:
                    pieces.append(sep)  # document boundary inside the block
                    used += 1
                else:  # no room for boundary + anything: the block boundary is the document boundary
                    yield emit()
                    pieces, used = [], 0
            for sentence in doc:
                for start in range(0, max(len(sentence), 1), room):
                    chunk = np.asarray(sentence[start : start + room], dtype=np.int32)
                    if len(chunk) == 0:
                        continue
                    if used + len(chunk) > room:
                        if pieces and pieces[-1] is sep:  # never end a block on a boundary marker
                            pieces.pop()
                        if pieces:
                            yield emit()
                        pieces, used = [], 0
                    pieces.append(chunk)
                    used += len(chunk)
        if pieces and pieces[-1] is sep:
            pieces.pop()
        if pieces:
            yield emit()


__all__ = ["PackedBlocks"]
