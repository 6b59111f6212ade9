"""BERT's and ALBERT's sentence-pair examples ``[CLS] A [SEP] B [SEP]``: next-sentence prediction
(B continues A, or comes from another document) and sentence-order prediction (A and B consecutive,
swapped half the time), A and B being segments of sentences (RoBERTa's SEGMENT-PAIR) or single
sentences (SENTENCE-PAIR)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pretrainlab.data.examples import Documents, Example, ExampleBuilder, as_documents


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

    With ``unit="sentences"`` (RoBERTa's SENTENCE-PAIR; Liu et al., 2019, Table 2), A and B are one
    sentence each: A is a document's sentence and B the next one, or for a random NSP pair one
    sentence of another document (the next one then starts the next pair). A document's last
    sentence, when it has no pair of its own, is left out rather than cut. ``short_seq_prob`` does
    not apply.

    The longer segment is truncated, one token at a time from a random end, until the pair fits.
    """

    version = 2

    max_len: int
    cls_id: int
    sep_id: int
    task: str = "nsp"
    short_seq_prob: float = 0.1
    unit: str = "segments"

    def __post_init__(self) -> None:
        if self.task not in ("nsp", "sop"):
            raise ValueError(f"SentencePairs.task must be 'nsp' or 'sop', got {self.task!r}.")
        if self.unit not in UNITS:
            raise ValueError(f"SentencePairs.unit must be one of {', '.join(UNITS)}, got {self.unit!r}.")
        if self.max_len < 5:
            raise ValueError(f"max_seq_len={self.max_len} is too short for a sentence pair (needs at least 5).")

    def __call__(
        self, documents: Documents | Sequence[Sequence[np.ndarray]], rng: np.random.Generator
    ) -> Iterator[Example]:
        documents = as_documents(documents)
        if self.task == "nsp" and len(documents) < 2:
            raise ValueError("next-sentence prediction needs at least two documents to draw negatives from.")
        for d in range(len(documents)):
            if self.unit == "sentences":
                yield from self._sentence_pairs(documents, d, rng)
            else:
                yield from self._document(documents, d, rng)

    def _sentence_pairs(self, documents: Documents, d: int, rng: np.random.Generator) -> Iterator[Example]:
        """SENTENCE-PAIR: each pair is two sentences, consecutive ones of document ``d`` or (a random NSP
        pair) one of it and one of another document."""
        doc = [s for s in documents[d] if len(s)]
        i = 0
        while i + 1 < len(doc):
            a, b = doc[i], doc[i + 1]
            if self.task == "nsp":
                if rng.random() < 0.5:
                    other = int(rng.integers(0, len(documents) - 1))
                    other += other >= d  # uniformly among the *other* documents
                    random_b = self._random_segment(documents, other, 1, rng)
                    if random_b is None:
                        i += 1
                        continue
                    b, label, step = random_b, 1, 1  # the real next sentence starts the next pair
                else:
                    label, step = 0, 2
            else:
                label, step = int(rng.random() < 0.5), 2
                if label:
                    a, b = b, a
            a, b = self._truncate(a, b, rng)
            yield self._pair(a, b, label)
            i += step

    def _document(self, documents: Documents, d: int, rng: np.random.Generator) -> Iterator[Example]:
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
    def _random_segment(documents: Documents, d: int, min_tokens: int, rng: np.random.Generator) -> np.ndarray | None:
        """Sentences of document ``d`` from a random start until ``min_tokens`` are gathered. Only the
        sentences used are read (a document can be a whole book)."""
        n = documents.num_sentences(d)
        if n == 0:
            return None
        start = int(rng.integers(0, n))
        parts, got = [], 0
        for i in range(start, n):
            s = documents.sentence(d, i)
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
            out.append(seg[front : len(seg) - (removed - front)])
        return out[0], out[1]

    def _pair(self, a: np.ndarray, b: np.ndarray, label: int) -> Example:
        ids = np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]]).astype(np.int32)
        types = np.zeros(len(ids), dtype=np.int8)
        types[len(a) + 2 :] = 1
        return {"input_ids": ids, "token_type_ids": types, "label": np.array(label, dtype=np.int8)}


UNITS = ("segments", "sentences")

__all__ = ["UNITS", "SentencePairs"]
