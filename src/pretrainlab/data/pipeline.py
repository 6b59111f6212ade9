"""The pretraining data path, one direction:

    corpus -> documents (lists of sentences) -> tokenizer (trained or loaded, cached)
           -> tokenized documents (Arrow, cached) -> examples built by the objective (Arrow, cached)
           -> batches (batches.py): the objective's collator masks them, seeded by (seed, split, epoch, batch)

Caches live under ``cache_dir`` and are keyed by hashes of everything that changes them, so a
second run with the same settings reads them instead of recomputing. Each cache entry is written
to a temporary name and renamed into place under a file lock: concurrent runs (DDP ranks, a sweep)
and interrupted runs never see half-written entries.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer

from pretrainlab import atomic
from pretrainlab.data.arrow import ExampleStore, TokenizedDocuments, examples_to_table, read_table, write_table
from pretrainlab.data.corpus import Corpus, CorpusError
from pretrainlab.data.examples import ExampleBuilder
from pretrainlab.data.hashing import fingerprint
from pretrainlab.data.packed import PackedCorpus
from pretrainlab.data.tokenizer import TokenizerSpec

log = logging.getLogger("pretrainlab")


def _tokenize_batch(batch: dict, tokenizer: Tokenizer) -> dict:
    flat = [s for doc in batch["sentences"] for s in doc]
    encoded = tokenizer.encode_batch(flat, add_special_tokens=False) if flat else []
    out, k = [], 0
    for doc in batch["sentences"]:
        out.append([np.asarray(e.ids, dtype=np.int32) for e in encoded[k : k + len(doc)]])
        k += len(doc)
    return {"ids": out}


class PretrainData:
    """Documents, tokenizer, tokenized corpus and examples of one corpus, all cached.

    The held-out split is a seeded random ``val_fraction`` of the documents (at least one), so
    validation text is never seen in training, whichever objective builds the examples.
    """

    def __init__(
        self,
        corpus: Corpus,
        tokenizer: TokenizerSpec,
        cache_dir: str | Path,
        val_fraction: float = 0.05,
        split_seed: int = 0,
    ):
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
                    raise CorpusError(
                        f"the corpus ({self.corpus.describe()}) has {len(self._documents)} document(s); "
                        f"{self.corpus.few_documents_hint()}"
                    )
                log.info(
                    "corpus: %s, %d documents (%.1fs)",
                    self.corpus.describe(),
                    len(self._documents),
                    time.perf_counter() - t,
                )
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
        if self._tokenizer is None and isinstance(self.corpus, PackedCorpus):
            self._tokenizer = self.corpus.tokenizer(self.tokenizer_spec)
        if self._tokenizer is None:
            spec = self.tokenizer_spec
            cached = spec.kind != "pretrained" and spec.cache_path(self.corpus_key, self.cache_dir).is_file()
            t = time.perf_counter()
            self._tokenizer = spec.get(self.sentences(), self.corpus_key, self.cache_dir)
            how = "loaded from cache" if cached else ("loaded" if spec.kind == "pretrained" else "trained")
            log.info(
                "tokenizer: %s %s, vocabulary %d (%.1fs)",
                spec.kind,
                how,
                self._tokenizer.get_vocab_size(),
                time.perf_counter() - t,
            )
        return self._tokenizer

    @cached_property
    def tokenized_key(self) -> str:
        return fingerprint({"corpus": self.corpus_key, "tokenizer": self.tokenizer.to_str()})

    # tokenized corpus
    @property
    def tokenized(self) -> TokenizedDocuments:
        if self.corpus.streaming:
            raise RuntimeError("a streamed corpus is tokenized on the fly, not cached")
        if self._tokenized is None and isinstance(self.corpus, PackedCorpus):
            self._tokenized = self.corpus.tokenized()  # tokenized when it was packed
        if self._tokenized is None:
            import datasets

            path = self.cache_dir / "tokenized" / self.tokenized_key / "data.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path.parent) + ".lock"):
                if path.is_file():
                    log.info("tokenized corpus: loaded from cache %s", path.parent)
                else:
                    t = time.perf_counter()
                    features = datasets.Features({"ids": datasets.Sequence(datasets.Sequence(datasets.Value("int32")))})
                    atomic.write_named(
                        path,
                        lambda tmp: self.documents.map(
                            _tokenize_batch,
                            batched=True,
                            batch_size=512,
                            remove_columns=["sentences"],
                            features=features,
                            fn_kwargs={"tokenizer": self.tokenizer},
                            cache_file_name=str(tmp),
                            new_fingerprint=self.tokenized_key,
                            desc="tokenizing",
                        ),
                    )
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
        key = fingerprint(
            {
                "tokenized": self.tokenized_key,
                "builder": builder.key(),
                "split": split,
                "val_fraction": self.val_fraction,
                "split_seed": self.split_seed,
                "format": "arrow-ipc",
            }
        )
        final = self.cache_dir / "examples" / key
        with FileLock(str(final) + ".lock"):
            if final.is_dir():
                log.info("%s examples: loaded from cache %s", split, final)
            else:
                t = time.perf_counter()
                docs = self.tokenized.subset(self.split_indices(split))
                rng = np.random.default_rng([self.split_seed, 1 if split == "val" else 0])

                def build(tmp: Path) -> None:
                    write_table(examples_to_table(builder(docs, rng)), tmp / "examples.arrow")

                atomic.build_dir(final, build, replace=False)
                log.info("%s examples: built in %.1fs -> %s", split, time.perf_counter() - t, final)
            table = read_table(final / "examples.arrow")
        store = ExampleStore(table)
        if len(store) == 0:
            raise ValueError(
                f"the {split} split produced no examples from {self.corpus.describe()}; the corpus is too "
                f"small for this objective (add documents, or lower val_fraction)."
            )
        return store


__all__ = ["PretrainData"]
