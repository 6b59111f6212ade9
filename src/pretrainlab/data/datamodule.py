"""PretrainDataModule: an objective's examples as masked batches, sharded across DDP ranks."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
from torch.utils.data import DataLoader

from pretrainlab.data.arrow import ExampleStore
from pretrainlab.data.batches import EpochBatches, MaskedBatches, ResumableLoader, StreamingBatches
from pretrainlab.data.examples import ExampleBuilder
from pretrainlab.data.pipeline import PretrainData
from pretrainlab.runtime.signals import worker_init


class PretrainDataModule(L.LightningDataModule):
    """Serves the objective's examples as masked batches; shards them across DDP ranks."""

    def __init__(
        self,
        data: PretrainData,
        builder: ExampleBuilder,
        collator,
        batch_size: int,
        seed: int,
        num_workers: int = 0,
        val_batch_size: int | None = None,
        val_documents: int = 200,
        buffer_documents: int = 1000,
        accumulate: int = 1,
    ):
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
        # an objective whose batches change over the run: each training batch's place in it (from its
        # optimizer step); validation batches are those of the run's end
        self.progress: Callable[[int], float] | None = None

    def prepare(self) -> None:
        """Build (or load) both splits now: cheap when cached, and errors surface before training."""
        if not self.data.corpus.streaming:
            self.train_store = self.data.examples(self.builder, "train")
            self.val_store = self.data.examples(self.builder, "val")

    def setup(self, stage: str | None = None) -> None:
        if self.train_store is None and not self.data.corpus.streaming:
            self.prepare()

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        # the token count every rank shares becomes a number on the host: read without the device
        if "global_tokens" in batch:
            batch["global_tokens"] = float(batch["global_tokens"])
        return batch

    def _rank(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, dataset, sampler=None, cls=DataLoader, **kwargs) -> DataLoader:
        return cls(
            dataset,
            sampler=sampler,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            worker_init_fn=worker_init,
            **kwargs,
        )

    def _store(self, split: str) -> ExampleStore:
        store = self.train_store if split == "train" else self.val_store
        if store is None:
            raise RuntimeError(f"the {split} examples are not built yet: call prepare() or setup() first")
        return store

    def _global_step(self) -> int:
        trainer = getattr(self, "trainer", None)
        return trainer.global_step if trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        if self.data.corpus.streaming:
            return self._loader(
                StreamingBatches(
                    self.data,
                    self.builder,
                    self.collator,
                    self.batch_size,
                    self.seed,
                    "train",
                    self.val_documents,
                    self.buffer_documents,
                    rank,
                    world,
                )
            )
        store = self._store("train")
        sampler = EpochBatches(
            len(store),
            self.batch_size,
            self.seed,
            True,
            True,
            rank,
            world,
            accumulate=self.accumulate,
            lengths=store.lengths,
        )
        return self._loader(
            MaskedBatches(store, self.collator, self.seed, self.progress),
            sampler,
            ResumableLoader,
            step_fn=self._global_step,
        )

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        if self.data.corpus.streaming:
            return self._loader(
                StreamingBatches(
                    self.data,
                    self.builder,
                    self.collator,
                    self.val_batch_size,
                    self.seed,
                    "val",
                    self.val_documents,
                    self.buffer_documents,
                )
            )
        store = self._store("val")
        n = len(store)
        bs = min(self.val_batch_size, max(1, n // world))
        # fixed order and fixed masks: validation numbers are comparable across evaluations
        sampler = EpochBatches(
            n, bs, self.seed, shuffle=False, drop_last=True, rank=rank, world_size=world, follow_epochs=False
        )
        collator = self.collator if self.progress is None else self.collator.at(1.0)
        return self._loader(MaskedBatches(store, collator, self.seed + 1), sampler)


__all__ = ["PretrainDataModule"]
