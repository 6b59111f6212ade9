"""The pretraining data path, one direction:

    corpus -> documents (lists of sentences) -> tokenizer (trained or loaded, cached)
           -> tokenized documents (Arrow, cached) -> examples built by the objective (Arrow, cached)
           -> batches: the objective's collator masks them, seeded by (seed, split, epoch, batch)

Caches live under ``cache_dir`` and are keyed by hashes of everything that changes them, so a
second run with the same settings reads them instead of recomputing. Each cache entry is written
to a temporary name and renamed into place under a file lock: concurrent runs (DDP ranks, a sweep)
and interrupted runs never see half-written entries.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import datasets
import lightning as L
import numpy as np
import pyarrow as pa
import torch
from filelock import FileLock
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from pretrainlab import atomic
from pretrainlab.data.corpus import Corpus, CorpusError
from pretrainlab.data.hashing import fingerprint
from pretrainlab.data.tokenizer import TokenizerSpec
from pretrainlab.objectives.pairs import Example, ExampleBuilder
from pretrainlab.preemption import worker_init

log = logging.getLogger("pretrainlab")


# --- flat, zero-copy views of Arrow list columns ---------------------------------------------


def _list_offsets(arr: pa.Array) -> np.ndarray:
    lengths = arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


class TokenizedDocuments(Sequence):
    """Documents as lists of sentence arrays, viewed out of one flat token array."""

    def __init__(self, tokens: np.ndarray, sentence_offsets: np.ndarray, doc_offsets: np.ndarray):
        self.tokens, self.sentence_offsets, self.doc_offsets = tokens, sentence_offsets, doc_offsets

    @classmethod
    def from_arrow(cls, column: pa.ChunkedArray) -> "TokenizedDocuments":
        docs = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        sentences = docs.flatten()
        return cls(sentences.flatten().to_numpy(), _list_offsets(sentences), _list_offsets(docs))

    def __len__(self) -> int:
        return len(self.doc_offsets) - 1

    def __getitem__(self, d):  # type: ignore[override]
        if isinstance(d, slice):
            raise TypeError("index documents one at a time")
        s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
        o = self.sentence_offsets
        return [self.tokens[o[s]:o[s + 1]] for s in range(s0, s1)]

    def num_sentences(self, d: int) -> int:
        return int(self.doc_offsets[d + 1] - self.doc_offsets[d])

    def sentence(self, d: int, i: int) -> np.ndarray:
        s = self.doc_offsets[d] + i
        return self.tokens[self.sentence_offsets[s]:self.sentence_offsets[s + 1]]

    def subset(self, indices: np.ndarray) -> "_Subset":
        return _Subset(self, indices)

    @property
    def num_tokens(self) -> int:
        return int(len(self.tokens))


class _Subset(Sequence):
    def __init__(self, docs: Sequence, indices: np.ndarray):
        self.docs, self.indices = docs, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):  # type: ignore[override]
        return self.docs[int(self.indices[i])]

    def num_sentences(self, i: int) -> int:
        return self.docs.num_sentences(int(self.indices[i]))

    def sentence(self, i: int, j: int) -> np.ndarray:
        return self.docs.sentence(int(self.indices[i]), j)


class ExampleStore:
    """Examples of one split, memory-mapped from Arrow; ``store[i]`` is a dict of numpy arrays."""

    def __init__(self, table: pa.Table):
        self.num_examples = table.num_rows
        self.columns: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_list(col.type):
                self.columns[name] = (col.flatten().to_numpy(), _list_offsets(col))
            else:
                self.columns[name] = (col.to_numpy(), None)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, i: int) -> Example:
        out = {}
        for name, (values, offsets) in self.columns.items():
            out[name] = values[offsets[i]:offsets[i + 1]] if offsets is not None else values[i]
        return out

    @property
    def num_tokens(self) -> int:
        values, _ = self.columns["input_ids"]
        return int(len(values))


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


# --- the pipeline ------------------------------------------------------------------------------


def _tokenize_batch(batch: dict, tokenizer: Tokenizer) -> dict:
    flat = [s for doc in batch["sentences"] for s in doc]
    encoded = tokenizer.encode_batch(flat, add_special_tokens=False) if flat else []
    out, k = [], 0
    for doc in batch["sentences"]:
        out.append([np.asarray(e.ids, dtype=np.int32) for e in encoded[k:k + len(doc)]])
        k += len(doc)
    return {"ids": out}


class PretrainData:
    """Documents, tokenizer, tokenized corpus and examples of one corpus, all cached.

    The held-out split is a seeded random ``val_fraction`` of the documents (at least one), so
    validation text is never seen in training, whichever objective builds the examples.
    """

    def __init__(self, corpus: Corpus, tokenizer: TokenizerSpec, cache_dir: str | Path,
                 val_fraction: float = 0.05, split_seed: int = 0):
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}.")
        self.corpus, self.tokenizer_spec = corpus, tokenizer
        self.cache_dir = Path(os.path.expanduser(str(cache_dir)))
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self.corpus_key = corpus.fingerprint()
        self._documents = None
        self._tokenizer: Tokenizer | None = None
        self._tokenized: TokenizedDocuments | None = None

    # documents
    @property
    def documents(self):
        if self._documents is None:
            t = time.perf_counter()
            self._documents = self.corpus.documents(self.cache_dir / "corpora" / self.corpus_key)
            if not self.corpus.streaming:
                if len(self._documents) < 2:
                    raise CorpusError(f"the corpus ({self.corpus.describe()}) has {len(self._documents)} document(s); "
                                      f"{self.corpus.few_documents_hint()}")
                log.info("corpus: %s, %d documents (%.1fs)", self.corpus.describe(), len(self._documents),
                         time.perf_counter() - t)
        return self._documents

    def sentences(self) -> Iterator[str]:
        if self.corpus.streaming:
            for doc in self.documents:
                yield from doc["sentences"]
            return
        for batch in self.documents.iter(batch_size=256):
            for doc in batch["sentences"]:
                yield from doc

    # tokenizer
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            spec = self.tokenizer_spec
            cached = spec.kind != "pretrained" and spec.cache_path(self.corpus_key, self.cache_dir).is_file()
            t = time.perf_counter()
            self._tokenizer = spec.get(self.sentences(), self.corpus_key, self.cache_dir)
            how = "loaded from cache" if cached else ("loaded" if spec.kind == "pretrained" else "trained")
            log.info("tokenizer: %s %s, vocabulary %d (%.1fs)", spec.kind, how,
                     self._tokenizer.get_vocab_size(), time.perf_counter() - t)
        return self._tokenizer

    @cached_property
    def tokenized_key(self) -> str:
        return fingerprint({"corpus": self.corpus_key, "tokenizer": self.tokenizer.to_str()})

    # tokenized corpus
    @property
    def tokenized(self) -> TokenizedDocuments:
        if self.corpus.streaming:
            raise RuntimeError("a streamed corpus is tokenized on the fly, not cached")
        if self._tokenized is None:
            path = self.cache_dir / "tokenized" / self.tokenized_key / "data.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path.parent) + ".lock"):
                if path.is_file():
                    log.info("tokenized corpus: loaded from cache %s", path.parent)
                else:
                    t = time.perf_counter()
                    features = datasets.Features({"ids": datasets.Sequence(datasets.Sequence(datasets.Value("int32")))})
                    tmp = path.with_name(f".tmp-{os.getpid()}-data.arrow")
                    self.documents.map(
                        _tokenize_batch, batched=True, batch_size=512, remove_columns=["sentences"],
                        features=features, fn_kwargs={"tokenizer": self.tokenizer},
                        cache_file_name=str(tmp), new_fingerprint=self.tokenized_key, desc="tokenizing",
                    )
                    os.replace(tmp, path)
                    log.info("tokenized corpus: %s (%.1fs)", path.parent, time.perf_counter() - t)
                ds = datasets.Dataset.from_file(str(path))
            self._tokenized = TokenizedDocuments.from_arrow(ds.data.column("ids"))
            if self._tokenized.num_tokens == 0:
                raise ValueError(f"the corpus ({self.corpus.describe()}) tokenizes to no tokens: it is empty.")
        return self._tokenized

    def split_indices(self, split: str) -> np.ndarray:
        n = len(self.tokenized)
        if n < 2:
            raise ValueError(
                f"the corpus has {n} document; a held-out split needs at least 2. Add files, or split "
                f"text into documents at blank lines with data.doc_split=blank_line."
            )
        order = np.random.default_rng(self.split_seed).permutation(n)
        n_val = min(n - 1, max(1, int(round(self.val_fraction * n))))
        return np.sort(order[:n_val] if split == "val" else order[n_val:])

    # examples
    def examples(self, builder: ExampleBuilder, split: str) -> ExampleStore:
        key = fingerprint({"tokenized": self.tokenized_key, "builder": builder.key(), "split": split,
                           "val_fraction": self.val_fraction, "split_seed": self.split_seed})
        final = self.cache_dir / "examples" / key
        with FileLock(str(final) + ".lock"):
            if final.is_dir():
                log.info("%s examples: loaded from cache %s", split, final)
            else:
                t = time.perf_counter()
                docs = self.tokenized.subset(self.split_indices(split))
                rng = np.random.default_rng([self.split_seed, 1 if split == "val" else 0])

                def build(tmp: Path) -> None:
                    table = examples_to_table(builder(docs, rng))
                    datasets.disable_progress_bars()
                    try:
                        datasets.Dataset(table).save_to_disk(str(tmp))
                    finally:
                        datasets.enable_progress_bars()

                atomic.build_dir(final, build, replace=False)
                log.info("%s examples: built in %.1fs -> %s", split, time.perf_counter() - t, final)
            ds = datasets.load_from_disk(str(final))
        store = ExampleStore(ds.data.table)
        if len(store) == 0:
            raise ValueError(
                f"the {split} split produced no examples from {self.corpus.describe()}; the corpus is too "
                f"small for this objective (add documents, or lower val_fraction)."
            )
        return store


# --- batches -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchKey:
    epoch: int
    index: int
    example_ids: tuple[int, ...]


class EpochBatches(Sampler):
    """Yields the micro-batches of one rank for one epoch as ``BatchKey``s.

    The epoch's order is a permutation seeded by (seed, epoch), cut into global batches of
    ``batch_size x world_size x accumulate`` examples: one optimizer step. Rank r takes every
    world_size-th example of a global batch (ranks see disjoint examples) and splits its share
    into ``accumulate`` micro-batches of ``batch_size``. So the examples of every optimizer step are
    the same whatever the number of devices and the accumulation. ``set_epoch`` is called by
    Lightning; ``resume_at`` skips the micro-batches an interrupted epoch already consumed.
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int, shuffle: bool = True,
                 drop_last: bool = True, rank: int = 0, world_size: int = 1, follow_epochs: bool = True,
                 accumulate: int = 1):
        if batch_size < 1 or accumulate < 1:
            raise ValueError(f"batch size and accumulation must be positive, got {batch_size} and {accumulate}")
        self.n, self.batch_size, self.seed = num_examples, batch_size, seed
        self.shuffle, self.drop_last, self.rank, self.world_size = shuffle, drop_last, rank, world_size
        self.accumulate = accumulate
        self.epoch = 0
        self.follow_epochs = follow_epochs  # False: the same batches (and masks) every epoch
        self._skip = 0
        if self.num_global_batches() == 0:
            raise ValueError(
                f"{num_examples} examples make no full batch of {self.global_batch_size} (batch size x devices x "
                f"accumulation); lower batch_size or use more data."
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size * self.accumulate

    def set_epoch(self, epoch: int) -> None:
        if self.follow_epochs:
            self.epoch = epoch

    def resume_at(self, micro_batch: int) -> None:
        """The next iteration starts at this micro-batch of the epoch (then iterations are whole)."""
        self._skip = micro_batch

    def num_global_batches(self) -> int:
        per_step = self.global_batch_size
        return self.n // per_step if self.drop_last else -(-self.n // per_step)

    def __len__(self) -> int:
        return self.num_global_batches() * self.accumulate

    def __iter__(self) -> Iterator[BatchKey]:
        skip, self._skip = self._skip, 0
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        per_step, a = self.global_batch_size, self.accumulate
        for b in range(self.num_global_batches()):
            mine = order[b * per_step:(b + 1) * per_step][self.rank::self.world_size]
            for m in range(a):
                k = b * a + m  # this rank's micro-batch number in the epoch
                part = mine[m * self.batch_size:(m + 1) * self.batch_size]
                if k < skip or not len(part):
                    continue
                # masks are seeded by the key's index: unique per (step, rank, micro-batch)
                yield BatchKey(self.epoch, (b * self.world_size + self.rank) * a + m, tuple(int(i) for i in part))


class ResumableLoader(DataLoader):
    """A DataLoader over ``EpochBatches`` that Lightning checkpoints (the ``state_dict`` /
    ``load_state_dict`` interface): a run resumed mid-epoch continues with the micro-batch after
    the last one its checkpoint trained on, instead of restarting the epoch.

    Training consumes exactly ``accumulate`` micro-batches per optimizer step and every epoch has
    the same number of them, so the position is a function of the global step alone."""

    def __init__(self, *args, step_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_fn = step_fn

    def state_dict(self) -> dict:
        return {"global_step": int(self._step_fn()) if self._step_fn else 0,
                "accumulate": self.sampler.accumulate, "micro_batches": len(self.sampler)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("micro_batches") != len(self.sampler) or state.get("accumulate") != self.sampler.accumulate:
            raise ValueError(
                f"the checkpoint's data order ({state.get('micro_batches')} micro-batches per epoch, accumulation "
                f"{state.get('accumulate')}) differs from this run's ({len(self.sampler)}, {self.sampler.accumulate}): "
                f"resume with the same data, batch_size, device_batch_size and number of devices."
            )
        self.sampler.resume_at((state["global_step"] * self.sampler.accumulate) % len(self.sampler))


class MaskedBatches(Dataset):
    """Map-style dataset of whole batches: a ``BatchKey`` in, a collated (masked) batch out.

    The masking generator is seeded by (seed, epoch, batch index), so the masks of a batch do not
    depend on worker count, on which process builds it, or on whether the run was resumed; and a
    new epoch gives new masks (dynamic masking)."""

    def __init__(self, store: ExampleStore, collator, seed: int):
        self.store, self.collator, self.seed = store, collator, seed

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, key: BatchKey):
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, key.epoch, key.index]).generate_state(1)[0]))
        return self.collator([self.store[i] for i in key.example_ids], g)


class StreamingBatches(IterableDataset):
    """Batches from a streamed corpus: documents are tokenized on the fly, grouped in buffers of
    ``buffer_documents``, turned into examples by the objective's builder, shuffled within the
    buffer and masked. The first ``val_documents`` documents are held out for validation."""

    def __init__(self, data: PretrainData, builder: ExampleBuilder, collator, batch_size: int, seed: int,
                 split: str, val_documents: int = 200, buffer_documents: int = 1000, rank: int = 0,
                 world_size: int = 1):
        self.data, self.builder, self.collator = data, builder, collator
        self.batch_size, self.seed, self.split = batch_size, seed, split
        self.val_documents, self.buffer_documents = val_documents, buffer_documents
        self.rank, self.world_size = rank, world_size

    def _held_out(self) -> Iterator[dict]:
        for n, doc in enumerate(self.data.documents.iter()):
            if n >= self.val_documents:
                return
            yield doc

    def _documents(self) -> Iterator[list[np.ndarray]]:
        """This rank's (and worker's) documents, tokenized. Validation reads the first
        ``val_documents`` of the stream; training reads a disjoint shard per (rank, worker) and
        leaves those documents out."""
        tok = self.data.tokenizer
        if self.split == "val":
            stream = self._held_out()
        else:
            info = get_worker_info()
            workers = info.num_workers if info else 1
            held_out = {tuple(d["sentences"]) for d in self._held_out()}
            shard = (self.rank * workers + (info.id if info else 0), self.world_size * workers)
            stream = (d for d in self.data.documents.iter(shard=shard) if tuple(d["sentences"]) not in held_out)
        for doc in stream:
            encoded = tok.encode_batch(doc["sentences"], add_special_tokens=False)
            yield [np.asarray(e.ids, dtype=np.int32) for e in encoded]

    def __iter__(self):
        info = get_worker_info()
        rng = np.random.default_rng([self.seed, self.rank, info.id if info else 0])
        buffer: list = []
        pending: list[Example] = []
        for doc in self._documents():
            buffer.append(doc)
            if len(buffer) >= self.buffer_documents:
                pending += self._examples(buffer, rng)
                buffer = []
            while len(pending) >= self.batch_size:
                yield self._batch(pending[:self.batch_size], rng)
                pending = pending[self.batch_size:]
        if len(buffer) >= 2:
            pending += self._examples(buffer, rng)
        while len(pending) >= self.batch_size or (pending and self.split == "val"):
            yield self._batch(pending[:self.batch_size], rng)
            pending = pending[self.batch_size:]

    def _examples(self, documents: list, rng: np.random.Generator) -> list[Example]:
        examples = list(self.builder(documents, rng))
        rng.shuffle(examples)
        return examples

    def _batch(self, examples: list[Example], rng: np.random.Generator):
        return self.collator(examples, torch.Generator().manual_seed(int(rng.integers(2**62))))


class PretrainDataModule(L.LightningDataModule):
    """Serves the objective's examples as masked batches; shards them across DDP ranks."""

    def __init__(self, data: PretrainData, builder: ExampleBuilder, collator, batch_size: int, seed: int,
                 num_workers: int = 0, val_batch_size: int | None = None, val_documents: int = 200,
                 buffer_documents: int = 1000, accumulate: int = 1):
        """``batch_size`` is the micro-batch of one device; ``accumulate`` micro-batches make its
        share of one optimizer step."""
        super().__init__()
        self.data, self.builder, self.collator = data, builder, collator
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.accumulate = accumulate
        self.val_batch_size = val_batch_size or batch_size
        self.val_documents, self.buffer_documents = val_documents, buffer_documents
        self.train_store: ExampleStore | None = None
        self.val_store: ExampleStore | None = None

    def prepare(self) -> None:
        """Build (or load) both splits now: cheap when cached, and errors surface before training."""
        if not self.data.corpus.streaming:
            self.train_store = self.data.examples(self.builder, "train")
            self.val_store = self.data.examples(self.builder, "val")

    def setup(self, stage: str | None = None) -> None:
        if self.train_store is None and not self.data.corpus.streaming:
            self.prepare()

    def _rank(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, dataset, sampler=None, cls=DataLoader, **kwargs) -> DataLoader:
        return cls(
            dataset, sampler=sampler, batch_size=None, num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0, pin_memory=torch.cuda.is_available(),
            worker_init_fn=worker_init, **kwargs,
        )

    def _global_step(self) -> int:
        trainer = getattr(self, "trainer", None)
        return trainer.global_step if trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        if self.data.corpus.streaming:
            return self._loader(StreamingBatches(self.data, self.builder, self.collator, self.batch_size, self.seed,
                                                 "train", self.val_documents, self.buffer_documents, rank, world))
        sampler = EpochBatches(len(self.train_store), self.batch_size, self.seed, True, True, rank, world,
                               accumulate=self.accumulate)
        return self._loader(MaskedBatches(self.train_store, self.collator, self.seed), sampler, ResumableLoader,
                            step_fn=self._global_step)

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        if self.data.corpus.streaming:
            return self._loader(StreamingBatches(self.data, self.builder, self.collator, self.val_batch_size,
                                                 self.seed, "val", self.val_documents, self.buffer_documents))
        n = len(self.val_store)
        bs = min(self.val_batch_size, max(1, n // world))
        # fixed order and fixed masks: validation numbers are comparable across evaluations
        sampler = EpochBatches(n, bs, self.seed, shuffle=False, drop_last=True, rank=rank, world_size=world,
                               follow_epochs=False)
        return self._loader(MaskedBatches(self.val_store, self.collator, self.seed + 1), sampler)
