"""Pure example builders: tokenized documents in, training examples out.

A document is a list of sentences, each a 1-D integer array of token ids without special tokens.
Every builder is a small frozen dataclass (its fields are its cache key) whose ``__call__`` takes
the documents and a ``numpy.random.Generator`` and yields examples as dicts of numpy arrays:

    PackedBlocks     RoBERTa FULL-SENTENCES: contiguous sentences packed up to max_len, crossing
                     document boundaries with an extra separator            -> input_ids
    SentencePairs    BERT NSP (B is the continuation or from another document) or ALBERT SOP
                     (B is the continuation, swapped half the time)         -> input_ids,
                                                                               token_type_ids, label
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import numpy as np

Document = Sequence[np.ndarray]
Example = dict[str, np.ndarray]


class ExampleBuilder:
    """Base for builders; ``key()`` names everything that changes the examples (for caching).
    Bump ``version`` when the algorithm changes what it builds."""

    version = 1

    def key(self) -> dict:
        return {"builder": type(self).__name__, "version": self.version, **asdict(self)}

    def __call__(self, documents: Sequence[Document], rng: np.random.Generator) -> Iterator[Example]:
        raise NotImplementedError


@dataclass(frozen=True)
class PackedBlocks(ExampleBuilder):
    """``[CLS] s1 s2 ... [SEP]`` blocks of whole contiguous sentences, at most ``max_len`` tokens.

    Blocks run across documents; where one document ends and the next begins inside a block, an
    extra ``[SEP]`` marks the boundary. A sentence longer than a block is cut into block-sized
    pieces. No token is dropped or repeated, so the packed corpus is the corpus.
    """

    max_len: int
    cls_id: int
    sep_id: int

    def __call__(self, documents: Sequence[Document], rng: np.random.Generator | None = None) -> Iterator[Example]:
        budget = self.max_len - 2
        if budget < 1:
            raise ValueError(f"max_seq_len={self.max_len} leaves no room for tokens between [CLS] and [SEP].")
        sep = np.array([self.sep_id], dtype=np.int32)
        pieces: list[np.ndarray] = []
        used = 0

        def emit() -> Example:
            ids = np.concatenate([[self.cls_id], *pieces, [self.sep_id]]).astype(np.int32)
            return {"input_ids": ids}

        for d, doc in enumerate(documents):
            if d > 0 and used > 0:
                if used + 1 < budget:
                    pieces.append(sep)  # document boundary inside the block
                    used += 1
                else:  # no room for boundary + anything: the block boundary is the document boundary
                    yield emit()
                    pieces, used = [], 0
            for sentence in doc:
                for start in range(0, max(len(sentence), 1), budget):
                    chunk = np.asarray(sentence[start:start + budget], dtype=np.int32)
                    if len(chunk) == 0:
                        continue
                    if used + len(chunk) > budget:
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


@dataclass(frozen=True)
class SentencePairs(ExampleBuilder):
    """Sentence-pair examples ``[CLS] A [SEP] B [SEP]``, as BERT and ALBERT build them.

    For each document, chunks of consecutive sentences are gathered up to a target length
    (``max_len - 3``; with probability ``short_seq_prob`` a random shorter one). A chunk is cut at a
    random sentence boundary into A and B. Then:

    task="nsp": with probability 1/2 B is replaced by sentences from a different, randomly chosen
        document (label 1 = random); the sentences of the chunk that B would have used are put back
        and start the next chunk. A one-sentence chunk is cut inside the sentence for its real
        continuation (BERT instead always pairs it with a random B, which tilts the labels).
    task="sop": A and B stay consecutive; with probability 1/2 they are swapped (label 1 =
        swapped). A one-sentence chunk is cut inside the sentence.

    The longer segment is truncated, one token at a time from a random end, until the pair fits.
    """

    version = 2

    max_len: int
    cls_id: int
    sep_id: int
    task: str = "nsp"
    short_seq_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.task not in ("nsp", "sop"):
            raise ValueError(f"SentencePairs.task must be 'nsp' or 'sop', got {self.task!r}.")
        if self.max_len < 5:
            raise ValueError(f"max_seq_len={self.max_len} is too short for a sentence pair (needs at least 5).")

    def __call__(self, documents: Sequence[Document], rng: np.random.Generator) -> Iterator[Example]:
        if self.task == "nsp" and len(documents) < 2:
            raise ValueError("next-sentence prediction needs at least two documents to draw negatives from.")
        for d in range(len(documents)):
            yield from self._document(documents, d, rng)

    def _document(self, documents: Sequence[Document], d: int, rng: np.random.Generator) -> Iterator[Example]:
        doc = [s for s in documents[d] if len(s)]
        target = self._target_length(rng)
        chunk: list[np.ndarray] = []
        length = 0
        i = 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                example = None
                if self.task == "nsp":
                    example, put_back = self._nsp(chunk, documents, d, target, rng)
                    i -= put_back
                else:
                    example = self._sop(chunk, rng)
                if example is not None:
                    yield example
                chunk, length = [], 0
                target = self._target_length(rng)
            i += 1

    def _target_length(self, rng: np.random.Generator) -> int:
        """Tokens to gather for a pair: max_len - 3, or with probability short_seq_prob fewer."""
        max_tokens = self.max_len - 3
        return int(rng.integers(2, max_tokens + 1)) if rng.random() < self.short_seq_prob else max_tokens

    def _nsp(self, chunk, documents, d, target, rng) -> tuple[Example | None, int]:
        if len(chunk) >= 2:
            a_end = int(rng.integers(1, len(chunk)))
            a, b_real = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
        else:  # one sentence: its second part is the real continuation of its first
            a_end, only = 1, chunk[0]
            cut = int(rng.integers(1, len(only))) if len(only) >= 2 else len(only)
            a, b_real = only[:cut], only[cut:]
        if len(b_real) == 0 or rng.random() < 0.5:
            other = int(rng.integers(0, len(documents) - 1))
            other += other >= d  # uniformly among the *other* documents
            b = self._random_segment(documents, other, max(1, target - len(a)), rng)
            if b is None:
                return None, 0
            label, put_back = 1, len(chunk) - a_end
        else:
            b, label, put_back = b_real, 0, 0
        a, b = self._truncate(a, b, rng)
        return self._pair(a, b, label), put_back

    @staticmethod
    def _random_segment(documents, d: int, min_tokens: int, rng: np.random.Generator) -> np.ndarray | None:
        """Sentences of document ``d`` from a random start until ``min_tokens`` are gathered. Only the
        sentences used are read (a document can be a whole book)."""
        n = documents.num_sentences(d) if hasattr(documents, "num_sentences") else len(documents[d])
        if n == 0:
            return None
        start = int(rng.integers(0, n))
        parts, got = [], 0
        for i in range(start, n):
            s = documents.sentence(d, i) if hasattr(documents, "sentence") else documents[d][i]
            if len(s):
                parts.append(s)
                got += len(s)
                if got >= min_tokens:
                    break
        return np.concatenate(parts) if parts else None

    def _sop(self, chunk, rng) -> Example | None:
        if len(chunk) >= 2:
            a_end = int(rng.integers(1, len(chunk)))
            a, b = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
        else:
            only = chunk[0]
            if len(only) < 2:
                return None
            cut = int(rng.integers(1, len(only)))
            a, b = only[:cut], only[cut:]
        a, b = self._truncate(a, b, rng)
        swapped = int(rng.random() < 0.5)
        if swapped:
            a, b = b, a
        return self._pair(a, b, swapped)

    def _truncate(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Remove one token at a time from the longer segment until the pair fits; each removal
        takes the front or the back with probability 1/2, so the number taken from the front of a
        segment is Binomial(removed, 1/2)."""
        max_tokens = self.max_len - 3
        la, lb = len(a), len(b)
        excess = la + lb - max_tokens
        if excess <= 0:
            return a, b
        # the longer one is trimmed until both are equal; then, b first on ties, they alternate
        gap = min(excess, abs(la - lb))
        if la > lb:
            la -= gap
        else:
            lb -= gap
        rest = excess - gap
        la -= rest // 2
        lb -= rest - rest // 2
        out = []
        for seg, keep in ((a, la), (b, lb)):
            removed = len(seg) - keep
            front = int(rng.binomial(removed, 0.5)) if removed else 0
            out.append(seg[front:len(seg) - (removed - front)])
        return out[0], out[1]

    def _pair(self, a: np.ndarray, b: np.ndarray, label: int) -> Example:
        ids = np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]]).astype(np.int32)
        types = np.zeros(len(ids), dtype=np.int8)
        types[len(a) + 2:] = 1
        return {"input_ids": ids, "token_type_ids": types, "label": np.array(label, dtype=np.int8)}
