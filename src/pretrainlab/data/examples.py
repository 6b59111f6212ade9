"""What examples are built from, and what builds them: the protocol between the data pipeline and
the objectives.

A document is a sequence of sentences, each a 1-D integer array of token ids without special
tokens. Builders read documents through one interface, :class:`Documents` (whole documents, or
one sentence at a time, which matters when a document is a whole book); plain lists of lists are
wrapped by :func:`as_documents`. An example is a dict of numpy arrays (``input_ids``, and for
pairs ``token_type_ids`` and ``label``).

    ExampleBuilder   documents + a numpy Generator -> examples; a frozen dataclass whose fields
                     are its cache key (packing.PackedBlocks, sentence_pairs.SentencePairs)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict

import numpy as np

Example = dict[str, np.ndarray]


class Documents:
    """Tokenized documents. Subclasses give ``__len__``, ``num_sentences(d)`` and ``sentence(d, i)``."""

    def __len__(self) -> int:
        raise NotImplementedError

    def num_sentences(self, d: int) -> int:
        raise NotImplementedError

    def sentence(self, d: int, i: int) -> np.ndarray:
        raise NotImplementedError

    def __getitem__(self, d: int) -> list[np.ndarray]:
        """Document ``d``, as its list of sentences."""
        if not isinstance(d, (int, np.integer)):
            raise TypeError("index documents one at a time")
        return [self.sentence(d, i) for i in range(self.num_sentences(d))]

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        return (self[d] for d in range(len(self)))

    def subset(self, indices: np.ndarray) -> DocumentSubset:
        return DocumentSubset(self, indices)


class DocumentList(Documents):
    """Documents held as a list of lists of sentence arrays."""

    def __init__(self, documents: Sequence[Sequence[np.ndarray]]):
        self.documents = documents

    def __len__(self) -> int:
        return len(self.documents)

    def num_sentences(self, d: int) -> int:
        return len(self.documents[d])

    def sentence(self, d: int, i: int) -> np.ndarray:
        return self.documents[d][i]


class DocumentSubset(Documents):
    """The documents ``indices`` of ``documents``, in that order."""

    def __init__(self, documents: Documents, indices: np.ndarray):
        self.documents, self.indices = documents, indices

    def __len__(self) -> int:
        return len(self.indices)

    def num_sentences(self, d: int) -> int:
        return self.documents.num_sentences(int(self.indices[d]))

    def sentence(self, d: int, i: int) -> np.ndarray:
        return self.documents.sentence(int(self.indices[d]), i)


def as_documents(documents: Documents | Sequence[Sequence[np.ndarray]]) -> Documents:
    return documents if isinstance(documents, Documents) else DocumentList(documents)


class ExampleBuilder:
    """Base for builders; ``key()`` names everything that changes the examples (for caching).
    Bump ``version`` when the algorithm changes what it builds."""

    version = 1

    def key(self) -> dict:
        return {"builder": type(self).__name__, "version": self.version, **asdict(self)}  # type: ignore[call-overload]  # every builder is a dataclass

    def __call__(
        self, documents: Documents | Sequence[Sequence[np.ndarray]], rng: np.random.Generator
    ) -> Iterator[Example]:
        raise NotImplementedError


__all__ = ["DocumentList", "DocumentSubset", "Documents", "Example", "ExampleBuilder", "as_documents"]
