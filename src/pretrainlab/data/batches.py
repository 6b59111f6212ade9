"""Batches for pretraining: which examples each rank trains on at each step, and how they are
masked.

    EpochBatches      the sampler: a seeded order per epoch, cut into optimizer steps and shared out
                      over ranks and accumulation; resumable mid-epoch
    ResumableLoader   a DataLoader that Lightning checkpoints with the sampler's position
    MaskedBatches     a batch key in, a masked batch out (masks seeded by the key)
    StreamingBatches  batches from a streamed corpus, tokenized and built on the fly
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from pretrainlab.data.arrow import ExampleStore
from pretrainlab.data.examples import Example, ExampleBuilder
from pretrainlab.data.pipeline import PretrainData


@dataclass(frozen=True)
class BatchKey:
    epoch: int
    index: int
    example_ids: tuple[int, ...]
    global_tokens: int | None = None  # tokens of this micro-batch on every rank together (with lengths)
    step: int = 0  # the optimizer step it is trained in (epochs of equal length follow each other)


class EpochBatches(Sampler):
    """Yields the micro-batches of one rank for one epoch as ``BatchKey``s.

    The epoch's order is a permutation seeded by (seed, epoch), cut into global batches of
    ``batch_size x world_size x accumulate`` examples: one optimizer step. Rank r takes every
    world_size-th example of a global batch (ranks see disjoint examples) and splits its share
    into ``accumulate`` micro-batches of ``batch_size``. So the examples of every optimizer step are
    the same whatever the number of devices and the accumulation. ``set_epoch`` is called by
    Lightning; ``resume_at`` skips the micro-batches an interrupted epoch already consumed.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
        rank: int = 0,
        world_size: int = 1,
        follow_epochs: bool = True,
        accumulate: int = 1,
        lengths: np.ndarray | None = None,
    ):
        """``lengths``: the examples' token counts; then every key also says how many tokens its
        micro-batch holds on all ranks together (``global_tokens``), which every rank knows without
        communicating, since they share the order."""
        if batch_size < 1 or accumulate < 1:
            raise ValueError(f"batch size and accumulation must be positive, got {batch_size} and {accumulate}")
        self.n, self.batch_size, self.seed = num_examples, batch_size, seed
        self.shuffle, self.drop_last, self.rank, self.world_size = shuffle, drop_last, rank, world_size
        self.accumulate = accumulate
        self.lengths = lengths
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
        order = (
            np.random.default_rng([self.seed, self.epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        )
        per_step, a = self.global_batch_size, self.accumulate
        for b in range(self.num_global_batches()):
            step = order[b * per_step : (b + 1) * per_step]
            mine = step[self.rank :: self.world_size]
            for m in range(a):
                k = b * a + m  # this rank's micro-batch number in the epoch
                part = mine[m * self.batch_size : (m + 1) * self.batch_size]
                if k < skip or not len(part):
                    continue
                tokens = None
                if self.lengths is not None:  # micro-batch m of every rank
                    tokens = int(
                        sum(
                            self.lengths[
                                step[r :: self.world_size][m * self.batch_size : (m + 1) * self.batch_size]
                            ].sum()
                            for r in range(self.world_size)
                        )
                    )
                # masks are seeded by the key's index: unique per (step, rank, micro-batch)
                yield BatchKey(
                    self.epoch,
                    (b * self.world_size + self.rank) * a + m,
                    tuple(int(i) for i in part),
                    tokens,
                    self.epoch * self.num_global_batches() + b,
                )


class ResumableLoader(DataLoader):
    """A DataLoader over ``EpochBatches`` that Lightning checkpoints (the ``state_dict`` /
    ``load_state_dict`` interface): a run resumed mid-epoch continues with the micro-batch after
    the last one its checkpoint trained on, instead of restarting the epoch.

    Training consumes exactly ``accumulate`` micro-batches per optimizer step and every epoch has
    the same number of them, so the position is a function of the global step alone."""

    def __init__(self, *args, step_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_fn = step_fn

    @property
    def batches(self) -> EpochBatches:
        """The sampler, which is always an :class:`EpochBatches`."""
        return cast(EpochBatches, self.sampler)

    def state_dict(self) -> dict:
        return {
            "global_step": int(self._step_fn()) if self._step_fn else 0,
            "accumulate": self.batches.accumulate,
            "micro_batches": len(self.batches),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("micro_batches") != len(self.batches) or state.get("accumulate") != self.batches.accumulate:
            raise ValueError(
                f"the checkpoint's data order ({state.get('micro_batches')} micro-batches per epoch, accumulation "
                f"{state.get('accumulate')}) differs from this run's ({len(self.batches)}, {self.batches.accumulate}): "
                f"resume with the same data, batch_size, device_batch_size and number of devices."
            )
        self.batches.resume_at((state["global_step"] * self.batches.accumulate) % len(self.batches))


class MaskedBatches(Dataset):
    """Map-style dataset of whole batches: a ``BatchKey`` in, a collated (masked) batch out.

    The masking generator is seeded by (seed, epoch, batch index), so the masks of a batch do not
    depend on worker count, on which process builds it, or on whether the run was resumed; and a
    new epoch gives new masks (dynamic masking). With ``progress`` (an objective whose batches
    change over the run), each batch is made by ``collator.at(progress(key.step))``."""

    def __init__(self, store: ExampleStore, collator, seed: int, progress: Callable[[int], float] | None = None):
        self.store, self.collator, self.seed, self.progress = store, collator, seed, progress

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, key: BatchKey):
        g = torch.Generator().manual_seed(
            int(np.random.SeedSequence([self.seed, key.epoch, key.index]).generate_state(1)[0])
        )
        collator = self.collator if self.progress is None else self.collator.at(self.progress(key.step))
        batch = collator([self.store[i] for i in key.example_ids], g)
        if key.global_tokens is not None:
            batch["global_tokens"] = torch.tensor(key.global_tokens)
        return batch


class StreamingBatches(IterableDataset):
    """Batches from a streamed corpus: documents are tokenized on the fly, grouped in buffers of
    ``buffer_documents``, turned into examples by the objective's builder, shuffled within the
    buffer and masked. The first ``val_documents`` documents are held out for validation."""

    def __init__(
        self,
        data: PretrainData,
        builder: ExampleBuilder,
        collator,
        batch_size: int,
        seed: int,
        split: str,
        val_documents: int = 200,
        buffer_documents: int = 1000,
        rank: int = 0,
        world_size: int = 1,
    ):
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
                yield self._batch(pending[: self.batch_size], rng)
                pending = pending[self.batch_size :]
        if len(buffer) >= 2:
            pending += self._examples(buffer, rng)
        while len(pending) >= self.batch_size or (pending and self.split == "val"):
            yield self._batch(pending[: self.batch_size], rng)
            pending = pending[self.batch_size :]

    def _examples(self, documents: list, rng: np.random.Generator) -> list[Example]:
        examples = list(self.builder(documents, rng))
        rng.shuffle(examples)
        return examples

    def _batch(self, examples: list[Example], rng: np.random.Generator):
        return self.collator(examples, torch.Generator().manual_seed(int(rng.integers(2**62))))


__all__ = ["BatchKey", "EpochBatches", "MaskedBatches", "ResumableLoader", "StreamingBatches"]
