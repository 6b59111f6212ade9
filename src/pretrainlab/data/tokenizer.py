"""Tokenizers: trained on the corpus with ``tokenizers`` (WordPiece or byte-level BPE) or loaded
from a ``tokenizer.json``. A trained tokenizer is cached under a hash of the corpus and the
settings, so a second run with the same corpus and settings loads it instead of training."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pretrainlab.data.hashing import fingerprint
from pretrainlab.tokens import SpecialTokens

SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


@dataclass
class TokenizerSpec:
    """``kind``: wordpiece (BERT) | bpe (byte-level, RoBERTa/GPT-2 style) | pretrained (``path``).

    ``special_tokens`` maps the roles pad/unk/cls/sep/mask to strings in the vocabulary; the
    defaults are BERT's. A pretrained tokenizer.json must contain all five.
    """

    kind: str = "wordpiece"
    vocab_size: int = 30522
    lowercase: bool = True
    min_frequency: int = 2
    path: str | None = None
    special_tokens: dict = field(default_factory=lambda: dict(SPECIALS))
    max_training_sentences: int | None = None  # for streamed corpora: train on the first N sentences

    def __post_init__(self) -> None:
        if self.kind not in ("wordpiece", "bpe", "pretrained"):
            raise ValueError(f"tokenizer.kind must be wordpiece, bpe or pretrained, got {self.kind!r}.")
        self.special_tokens = {**SPECIALS, **dict(self.special_tokens or {})}
        missing = set(SPECIALS) - set(self.special_tokens)
        if missing:
            raise ValueError(f"tokenizer.special_tokens lacks roles {sorted(missing)}.")

    def key(self, corpus_fingerprint: str) -> str:
        if self.kind == "pretrained":
            path = self._pretrained_path()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            return fingerprint({"pretrained": digest, "specials": self.special_tokens})
        return fingerprint({"corpus": corpus_fingerprint, **asdict(self), "path": None})

    def _pretrained_path(self) -> Path:
        if not self.path:
            raise FileNotFoundError("tokenizer=pretrained needs tokenizer.path=<tokenizer.json or its directory>.")
        p = Path(os.path.expanduser(self.path))
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer.path: {p} does not exist (expected a tokenizer.json).")
        return p

    def cache_path(self, corpus_fingerprint: str, cache_dir: Path) -> Path:
        """Where a tokenizer trained on this corpus with these settings is cached."""
        return cache_dir / "tokenizers" / self.key(corpus_fingerprint) / "tokenizer.json"

    def get(self, sentences: Iterable[str], corpus_fingerprint: str, cache_dir: Path) -> Tokenizer:
        """Load the cached tokenizer for this corpus and spec, or train (or load) and cache it."""
        if self.kind == "pretrained":
            tok = Tokenizer.from_file(str(self._pretrained_path()))
            special_tokens(tok, self.special_tokens)  # validates the specials are there
            return tok
        path = self.cache_path(corpus_fingerprint, cache_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if path.is_file():
                return Tokenizer.from_file(str(path))
            tok = self.train(sentences)
            atomic_write_text(path, tok.to_str())
        return tok

    def train(self, sentences: Iterable[str]) -> Tokenizer:
        specials = [self.special_tokens[r] for r in ("pad", "unk", "cls", "sep", "mask")]
        if self.kind == "wordpiece":
            tok = Tokenizer(models.WordPiece(unk_token=self.special_tokens["unk"], max_input_chars_per_word=100))
            tok.normalizer = normalizers.BertNormalizer(lowercase=self.lowercase, strip_accents=None,
                                                        clean_text=True, handle_chinese_chars=True)
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece()
            trainer = trainers.WordPieceTrainer(vocab_size=self.vocab_size, min_frequency=self.min_frequency,
                                                special_tokens=specials, show_progress=False)
        else:
            tok = Tokenizer(models.BPE(unk_token=self.special_tokens["unk"]))
            norm = [normalizers.NFC()] + ([normalizers.Lowercase()] if self.lowercase else [])
            tok.normalizer = normalizers.Sequence(norm)
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
            tok.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(vocab_size=self.vocab_size, min_frequency=self.min_frequency,
                                          special_tokens=specials, show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_limit(sentences, self.max_training_sentences), trainer=trainer)
        return tok


def _limit(items: Iterable[str], n: int | None) -> Iterable[str]:
    for i, item in enumerate(items):
        if n is not None and i >= n:
            return
        yield item


def special_tokens(tok: Tokenizer, names: dict | None = None) -> SpecialTokens:
    """Special ids and the continuation-piece table of a tokenizer."""
    names = {**SPECIALS, **(names or {})}
    ids = {}
    for role, token in names.items():
        i = tok.token_to_id(token)
        if i is None:
            raise ValueError(
                f"the tokenizer has no {role} token {token!r}; set tokenizer.special_tokens.{role} "
                f"to the string it uses."
            )
        ids[role] = i
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    continuation = np.zeros(vocab_size, dtype=bool)
    model = json.loads(tok.to_str())["model"]
    for token, i in tok.get_vocab(with_added_tokens=True).items():
        if model["type"] == "WordPiece":
            continuation[i] = token.startswith(model.get("continuing_subword_prefix", "##"))
        elif model["type"] == "BPE" and isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel):
            continuation[i] = not token.startswith("\u0120")  # 'Ġ' marks a word start
    continuation[[ids[r] for r in ids]] = False
    return SpecialTokens(vocab_size=vocab_size, pad_id=ids["pad"], unk_id=ids["unk"], cls_id=ids["cls"],
                         sep_id=ids["sep"], mask_id=ids["mask"], is_continuation=continuation)


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
