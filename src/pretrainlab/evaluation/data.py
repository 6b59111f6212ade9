"""What every evaluation's data shares: the block of settings it reads (:class:`DataBlock`, one block of
``conf/finetune.yaml``: ``glue``, ``ner``, ``blimp``, ``squad``) and the base of the sets it can generate in
the synthetic language (:class:`SyntheticSet`), for the offline test suite and for studies on the
synthetic corpus.

A block's ``source`` is ``auto`` (local when a ``data_dir`` is set, else the hub), ``hub``, ``local`` or
``synthetic`` (generated into the cache once per settings, then read as a local directory):
:meth:`DataBlock.root` resolves it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pretrainlab import atomic
from pretrainlab.config import plain_or_none
from pretrainlab.data.hashing import fingerprint
from pretrainlab.data.sources import local_root

DEFAULT_CACHE = "~/.cache/pretrainlab"


@dataclass(frozen=True)
class SyntheticSet:
    """A data set in the synthetic language (``pretrainlab.data.synthetic``) that an evaluation reads with
    ``<block>.source=synthetic``. Its settings are its fields (those of ``<block>.synthetic``):
    ``language_seed`` and ``num_topics`` must be the pretraining corpus's (``data.seed``, ``data.num_topics``),
    or its words are not the encoder's. ``write(cache_dir)`` generates it once per settings into
    ``<cache_dir>/<folder>/<key>/``, atomically (a set written at the same moment by another process is
    kept); :meth:`generate` is each set's own. ``version`` changes whenever the generator makes other data
    for the same settings, so that a cached set of the old generator is not read as the new one's."""

    folder: ClassVar[str]
    version: ClassVar[int]

    seed: int = 0
    language_seed: int = 0
    num_topics: int = 8

    def key(self) -> str:
        """The hash of its settings and its generator's version: the name of its folder in the cache."""
        return fingerprint({**asdict(self), "version": self.version})

    def write(self, cache_dir: str | Path) -> Path:
        """Its folder in the cache, generated first when it is not there."""
        final = Path(os.path.expanduser(str(cache_dir))) / self.folder / self.key()
        if final.is_dir():
            return final
        return atomic.build_dir(final, self.generate, replace=False)

    def generate(self, into: Path) -> None:
        """Write the set's files into the (empty) folder ``into``, in the layout its readers read."""
        raise NotImplementedError


@dataclass(frozen=True)
class DataBlock:
    """An evaluation's data settings, read once from its block of the fine-tuning config: where the data
    comes from (``source``, ``data_dir``, the cache that synthetic sets are generated into and their
    settings), how much of it is used (``max_train_examples``, ``max_eval_examples``) and the block's own
    settings (``options``: ``glue.group_by_length``, ``ner.tag_column``, ``blimp.max_pairs``)."""

    name: str  # the block's key in the config: glue, ner, blimp, squad
    source: str = "auto"
    data_dir: str | None = None
    cache_dir: str = DEFAULT_CACHE
    synthetic: dict = field(default_factory=dict)
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    options: dict = field(default_factory=dict)

    COMMON: ClassVar[tuple[str, ...]] = ("source", "data_dir", "synthetic", "max_train_examples", "max_eval_examples")

    @classmethod
    def of(cls, block: Any, name: str, cache_dir: str | None = None) -> DataBlock:
        """The block ``name`` of a composed config (``block``: its node or a dict; missing: every default)."""
        plain = (block if isinstance(block, dict) else plain_or_none(block)) or {}
        return cls(
            name=name,
            source=str(plain.get("source", "auto")),
            data_dir=plain.get("data_dir"),
            cache_dir=str(cache_dir or DEFAULT_CACHE),
            synthetic=dict(plain.get("synthetic") or {}),
            max_train_examples=plain.get("max_train_examples"),
            max_eval_examples=plain.get("max_eval_examples"),
            options={k: v for k, v in plain.items() if k not in cls.COMMON},
        )

    def root(self, synthetic: type[SyntheticSet], layout: str) -> Path | None:
        """The local folder the data is read from (a synthetic set generated into the cache first), or None
        for the hub. ``layout`` says in an error what a local folder must hold."""
        return local_root(
            self.name, self.source, self.data_dir, layout, lambda: synthetic(**self.synthetic).write(self.cache_dir)
        )

    @property
    def synthetic_language(self) -> dict[str, int]:
        """The synthetic language its synthetic set is drawn from (compared with the encoder's corpus)."""
        return {
            "language_seed": self.synthetic.get("language_seed", SyntheticSet.language_seed),
            "num_topics": self.synthetic.get("num_topics", SyntheticSet.num_topics),
        }


__all__ = ["DEFAULT_CACHE", "DataBlock", "SyntheticSet"]
