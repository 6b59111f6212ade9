"""Flat, zero-copy views of Arrow list columns: the tokenized corpus as documents, and a split's
examples as a store indexed like a list."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from pretrainlab.data.examples import Documents, Example


def list_offsets(arr: pa.Array) -> np.ndarray:
    lengths = arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


class TokenizedDocuments(Documents):
    """Documents as lists of sentence arrays, viewed out of one flat token array (no copy)."""

    def __init__(self, tokens: np.ndarray, sentence_offsets: np.ndarray, doc_offsets: np.ndarray):
        self.tokens, self.sentence_offsets, self.doc_offsets = tokens, sentence_offsets, doc_offsets

    @classmethod
    def from_arrow(cls, column: pa.ChunkedArray) -> TokenizedDocuments:
        docs = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        sentences = docs.flatten()
        return cls(sentences.flatten().to_numpy(), list_offsets(sentences), list_offsets(docs))

    def __len__(self) -> int:
        return len(self.doc_offsets) - 1

    def __getitem__(self, d: int) -> list[np.ndarray]:
        if not isinstance(d, (int, np.integer)):
            raise TypeError("index documents one at a time")
        s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
        o = self.sentence_offsets
        return [self.tokens[o[s] : o[s + 1]] for s in range(s0, s1)]

    def num_sentences(self, d: int) -> int:
        return int(self.doc_offsets[d + 1] - self.doc_offsets[d])

    def sentence(self, d: int, i: int) -> np.ndarray:
        s = self.doc_offsets[d] + i
        return self.tokens[self.sentence_offsets[s] : self.sentence_offsets[s + 1]]

    @property
    def num_tokens(self) -> int:
        return int(len(self.tokens))


class ExampleStore:
    """Examples of one split, memory-mapped from Arrow; ``store[i]`` is a dict of numpy arrays."""

    def __init__(self, table: pa.Table):
        self.num_examples = table.num_rows
        self.columns: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_list(col.type):
                self.columns[name] = (col.flatten().to_numpy(), list_offsets(col))
            else:
                self.columns[name] = (col.to_numpy(), None)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, i: int) -> Example:
        out = {}
        for name, (values, offsets) in self.columns.items():
            out[name] = values[offsets[i] : offsets[i + 1]] if offsets is not None else values[i]
        return out

    @property
    def num_tokens(self) -> int:
        values, _ = self.columns["input_ids"]
        return int(len(values))

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """How often each token id occurs in the split's examples: (vocab_size,) int64."""
        return np.bincount(self.columns["input_ids"][0], minlength=vocab_size)[:vocab_size].astype(np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """Every example's number of tokens."""
        offsets = self.columns["input_ids"][1]
        assert offsets is not None, "input_ids is a list column"
        return np.diff(offsets)


def examples_to_table(examples: Iterable[Example]) -> pa.Table:
    columns: dict[str, list] = {}
    for e in examples:
        for k, v in e.items():
            columns.setdefault(k, []).append(v)
    if not columns:
        return pa.table({"input_ids": pa.array([], type=pa.list_(pa.int32()))})
    arrays = {}
    for k, vs in columns.items():
        if np.ndim(vs[0]) == 0:
            arrays[k] = pa.array(np.asarray(vs))
        else:
            lengths = np.fromiter((len(v) for v in vs), dtype=np.int64, count=len(vs))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32 if lengths.sum() < 2**31 else np.int64)
            values = pa.array(np.concatenate(vs))
            cls = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
            arrays[k] = cls.from_arrays(pa.array(offsets), values)
    return pa.table(arrays)


def write_table(table: pa.Table, path: str | Path) -> None:
    """``table`` as an Arrow IPC file at ``path`` (read back, memory-mapped, by :func:`read_table`)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_table(path: str | Path) -> pa.Table:
    """The table of an Arrow IPC file, memory-mapped: nothing is read until it is used."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


__all__ = ["ExampleStore", "TokenizedDocuments", "examples_to_table", "list_offsets", "read_table", "write_table"]
