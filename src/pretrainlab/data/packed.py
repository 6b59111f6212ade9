"""A packed corpus: a corpus tokenized once, kept as token arrays beside its tokenizer, so that a run
can start from it on a machine that has neither the text nor the time to tokenize it (a GPU slot:
``pretrainlab.slot``). ``python train.py data=packed data.path=<dir> tokenizer.vocab_size=<n>``
pretrains on it as on the text it came from.

A pack is a directory:

    corpus.json                 what it is: the source corpus's identity and description, the
                                tokenizer settings it was tokenized with, counts, every file's sha256
    tokenizer.json              the tokenizer (trained on the source corpus, as a run would train it)
    tokens.npy                  every token of every sentence, in order (uint16 when the vocabulary fits)
    sentence_lengths.npy        tokens per sentence
    document_sentences.npy      sentences per document

Its identity (:meth:`PackedCorpus.key`) is the source corpus's, its tokenizer's and its tokens'
digests: a run on a pack records what it was trained on as precisely as a run on the text does,
and a damaged or edited pack is refused before any work (its files are checked against their
recorded digests when it is opened).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from pretrainlab import atomic
from pretrainlab.data.arrow import TokenizedDocuments
from pretrainlab.data.corpus import Corpus, CorpusError
from pretrainlab.data.hashing import file_digest, fingerprint
from pretrainlab.data.tokenizer import TokenizerSpec, load_tokenizer

FORMAT = 1
MANIFEST = "corpus.json"
FILES = ("tokenizer.json", "tokens.npy", "sentence_lengths.npy", "document_sentences.npy")
# the tokenizer settings that change its vocabulary (a pack is refused to a run that asks for other ones)
TOKENIZER_SETTINGS = ("kind", "vocab_size", "lowercase", "min_frequency", "special_tokens")


def _smallest(largest: int) -> np.dtype:
    """The smallest of uint16 and int32 that holds values up to ``largest``."""
    return np.dtype(np.uint16) if largest <= np.iinfo(np.uint16).max else np.dtype(np.int32)


def pack_corpus(
    out_dir: str | Path,
    tokenized: TokenizedDocuments,
    tokenizer: Tokenizer,
    spec: TokenizerSpec,
    source_key: dict,
    source: str,
) -> Path:
    """Write the pack of ``tokenized`` (the corpus ``source`` describes, whose identity is
    ``source_key``, tokenized by ``tokenizer`` trained with ``spec``) to ``out_dir`` (a new
    directory, written whole or not at all)."""
    out_dir = Path(out_dir)
    sentence_lengths = np.diff(tokenized.sentence_offsets)
    document_sentences = np.diff(tokenized.doc_offsets)

    def build(tmp: Path) -> None:
        (tmp / "tokenizer.json").write_text(tokenizer.to_str())
        vocab = tokenizer.get_vocab_size()
        np.save(tmp / "tokens.npy", tokenized.tokens.astype(_smallest(vocab - 1)))
        longest = int(sentence_lengths.max(initial=0))
        np.save(tmp / "sentence_lengths.npy", sentence_lengths.astype(_smallest(longest)))
        np.save(tmp / "document_sentences.npy", document_sentences.astype(np.int32))
        manifest = {
            "format": FORMAT,
            "source": source_key,
            "source_description": source,
            "tokenizer": {k: v for k, v in asdict(spec).items() if k in TOKENIZER_SETTINGS},
            "documents": int(len(document_sentences)),
            "sentences": int(len(sentence_lengths)),
            "tokens": int(tokenized.num_tokens),
            "vocab_size": int(vocab),
            "sha256": {name: file_digest(tmp / name) for name in FILES},
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    return atomic.build_dir(out_dir, build, replace=False)


@dataclass
class PackedCorpus(Corpus):
    """A corpus packed by :func:`pack_corpus` (``conf/data/packed.yaml``): its tokens and tokenizer,
    no text. ``path``: the pack's directory."""

    path: str = ""

    def __post_init__(self) -> None:
        self._manifest: dict | None = None

    @property
    def root(self) -> Path:
        if not self.path:
            raise FileNotFoundError("data=packed needs data.path=<a packed corpus directory> (pretrainlab.slot pack).")
        return Path(os.path.expanduser(str(self.path)))

    def manifest(self) -> dict:
        """The pack's ``corpus.json``, its files checked against their recorded digests (once)."""
        if self._manifest is not None:
            return self._manifest
        root = self.root
        path = root / MANIFEST
        if not path.is_file():
            raise CorpusError(
                f"data.path={self.path}: no {MANIFEST} there, so it is not a packed corpus. Pack one with "
                f"`python -m pretrainlab.slot pack`, or train on text with data=text data.files=[...]."
            )
        try:
            manifest = json.loads(path.read_text())
            digests = dict(manifest["sha256"])
            fmt = manifest["format"]
        except (ValueError, KeyError, TypeError) as e:
            raise CorpusError(f"{path} is not a packed corpus's manifest ({e}); pack the corpus again.") from None
        if fmt != FORMAT:
            raise CorpusError(
                f"{path}: pack format {fmt}, this pretrainlab reads format {FORMAT}; pack the corpus again."
            )
        for name in FILES:
            f = root / name
            if not f.is_file():
                raise CorpusError(f"{root} lacks {name}: the pack is incomplete; pack the corpus again.")
            if file_digest(f) != digests.get(name):
                raise CorpusError(
                    f"{f} is not the file the pack was made with (its sha256 differs from {path}'s): the pack is "
                    f"damaged or was edited. Pack the corpus again."
                )
        self._manifest = manifest
        return manifest

    def key(self) -> dict:
        m = self.manifest()
        return {
            "corpus": "PackedCorpus",
            "source": m["source"],
            "tokenizer": m["sha256"]["tokenizer.json"],
            "tokens": [m["sha256"][f] for f in FILES[1:]],
        }

    def documents(self, cache_dir: Path) -> Any:
        raise CorpusError(
            f"{self.describe()} holds tokens, not text: it cannot train another tokenizer or be split into "
            f"sentences again. Pretrain on it with the tokenizer it was packed with, or on the text (data=text)."
        )

    def tokenizer(self, spec: TokenizerSpec) -> Tokenizer:
        """The pack's tokenizer, for a run that asks for the tokenizer it was packed with (the settings
        that change a vocabulary: kind, vocab_size, lowercase, min_frequency, special tokens)."""
        packed = self.manifest()["tokenizer"]
        asked = {k: v for k, v in asdict(spec).items() if k in TOKENIZER_SETTINGS}
        differ = [k for k in TOKENIZER_SETTINGS if packed.get(k) != asked.get(k)]
        if differ:
            raise CorpusError(
                f"{self.describe()} was tokenized with "
                + ", ".join(f"tokenizer.{k}={packed.get(k)!r}" for k in differ)
                + ", and the run asks for "
                + ", ".join(f"{asked.get(k)!r}" for k in differ)
                + ": set those (conf/tokenizer or the command line), or pack the corpus again with the tokenizer you want."
            )
        return load_tokenizer(self.root / "tokenizer.json", "The pack is damaged: pack the corpus again.")

    def tokenized(self) -> TokenizedDocuments:
        """The pack's documents, read (memory-mapped) from its arrays."""
        self.manifest()
        root = self.root
        tokens = np.load(root / "tokens.npy", mmap_mode="r")
        sentence_lengths = np.load(root / "sentence_lengths.npy")
        document_sentences = np.load(root / "document_sentences.npy")
        sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths, dtype=np.int64)])
        doc_offsets = np.concatenate([[0], np.cumsum(document_sentences, dtype=np.int64)])
        if sentence_offsets[-1] != len(tokens) or doc_offsets[-1] != len(sentence_lengths):
            raise CorpusError(
                f"{root}: its arrays do not add up (tokens, sentences, documents); pack the corpus again."
            )
        if len(doc_offsets) - 1 < 2:
            raise CorpusError(f"{self.describe()} has fewer than 2 documents; a held-out split needs 2.")
        return TokenizedDocuments(np.asarray(tokens, dtype=np.int32), sentence_offsets, doc_offsets)

    def describe(self) -> str:
        m = self._manifest
        if m is None:
            return f"the packed corpus {self.path}"
        return (
            f"the packed corpus {self.path} ({m['documents']} documents, {m['tokens'] / 1e6:.1f}M tokens of "
            f"{m['source_description']})"
        )

    def fingerprint(self) -> str:
        return fingerprint(self.key())


__all__ = ["PackedCorpus", "pack_corpus"]
