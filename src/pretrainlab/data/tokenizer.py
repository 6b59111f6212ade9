"""Tokenizers: trained on the corpus with ``tokenizers`` (WordPiece or byte-level BPE) or loaded
from a ``tokenizer.json``. A trained tokenizer is cached under a hash of the corpus and the
settings, so a second run with the same corpus and settings loads it instead of training.

Training is reproducible: the same corpus and settings give the same tokenizer in every run
(see :func:`train_wordpiece` for what that takes with ``tokenizers``' WordPiece trainer)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pretrainlab import atomic
from pretrainlab.data.hashing import fingerprint
from pretrainlab.tokens import ROLES, SPECIALS, special_tokens

CONTINUATION = "##"  # WordPiece's prefix for a piece that continues a word

log = logging.getLogger("pretrainlab")


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
        if not isinstance(self.vocab_size, int) or self.vocab_size < 64:
            raise ValueError(f"tokenizer.vocab_size={self.vocab_size!r}: must be an integer of at least 64.")
        if not isinstance(self.min_frequency, int) or self.min_frequency < 1:
            raise ValueError(f"tokenizer.min_frequency={self.min_frequency!r}: must be an integer of at least 1.")
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
            path = self._pretrained_path()
            tok = load_tokenizer(path, "Point tokenizer.path at a tokenizer.json saved by the tokenizers library.")
            try:
                special_tokens(tok, self.special_tokens)  # validates the specials are there
            except ValueError as e:
                raise TokenizerFileError(f"{path}: {e}") from None
            return tok
        path = self.cache_path(corpus_fingerprint, cache_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if path.is_file():
                return load_tokenizer(path, f"It is a cache entry: delete {path.parent} and run again to retrain it.")
            tok = self.train(sentences, workdir=path.parent)
            atomic.write_text(path, tok.to_str())
        return tok

    def train(self, sentences: Iterable[str], workdir: str | Path | None = None) -> Tokenizer:
        """Train on ``sentences`` (read once). ``workdir``: where WordPiece training spools the
        sentences (default: the system's temporary directory)."""
        specials = [self.special_tokens[r] for r in ROLES]
        if self.kind == "wordpiece":
            return train_wordpiece(
                self._wordpiece,
                _limit(sentences, self.max_training_sentences),
                specials,
                self.vocab_size,
                self.min_frequency,
                workdir,
            )
        # byte-level BPE (its trainer is deterministic: every initial symbol is a byte, in sorted order)
        tok = Tokenizer(models.BPE(unk_token=self.special_tokens["unk"]))
        norm = [normalizers.NFC()] + ([normalizers.Lowercase()] if self.lowercase else [])
        tok.normalizer = normalizers.Sequence(norm)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.vocab_size,
            min_frequency=self.min_frequency,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(_limit(sentences, self.max_training_sentences), trainer=trainer)
        return tok

    def _wordpiece(self) -> Tokenizer:
        """An untrained BERT WordPiece tokenizer (normalizer, pre-tokenizer, decoder)."""
        tok = Tokenizer(
            models.WordPiece(
                unk_token=self.special_tokens["unk"],
                max_input_chars_per_word=100,
                continuing_subword_prefix=CONTINUATION,
            )
        )
        tok.normalizer = normalizers.BertNormalizer(
            lowercase=self.lowercase, strip_accents=None, clean_text=True, handle_chinese_chars=True
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
        return tok


def train_wordpiece(
    new_tokenizer,
    sentences: Iterable[str],
    specials: list[str],
    vocab_size: int,
    min_frequency: int,
    workdir: str | Path | None = None,
) -> Tokenizer:
    """Train a WordPiece tokenizer (``new_tokenizer()`` gives an untrained one) reproducibly.

    ``tokenizers``' WordPiece trainer gives the single-character continuation pieces (``##e``) their
    ids in hash-map order, which changes from one process to the next, and breaks ties between
    equally frequent merges by id, so two trainings on the same text can end with different
    vocabularies (huggingface/tokenizers#1794). Here those pieces are handed to the trainer up front
    as extra special tokens, in sorted order, which fixes their ids and so every merge; afterwards
    they are ordinary vocabulary entries again. Which pieces the text has is found while reading it
    (:class:`ContinuationScan`); should the training still create one that was not handed over, it
    trains again with it included, so the result never depends on the scan being exact.

    The sentences are read once: spooled to a temporary file (in ``workdir``) while they are
    scanned, and the trainer reads that file."""
    scan = ContinuationScan(new_tokenizer())
    with tempfile.TemporaryDirectory(dir=workdir, prefix=".wordpiece-") as tmp:
        text = Path(tmp) / "sentences.txt"
        with open(text, "w", encoding="utf-8") as f:
            for chunk in _chunks(sentences, 4096):
                joined = "\n".join(chunk)  # the pre-tokenizer splits at whitespace: lines do not change words
                scan.update(joined)
                f.write(joined)
                f.write("\n")
        pieces = scan.pieces()
        while True:
            tok = new_tokenizer()
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=specials + pieces,
                show_progress=False,
                continuing_subword_prefix=CONTINUATION,
            )
            tok.train([str(text)], trainer=trainer)
            missed = sorted(set(single_char_pieces(tok)) - set(pieces))
            if not missed:
                break
            log.info("tokenizer: training again with the continuation pieces %s included", missed)
            pieces = sorted(set(pieces) | set(missed))
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in specials]
    return Tokenizer.from_str(json.dumps(spec))


class ContinuationScan:
    """Finds the single-character continuation pieces (``##c``) a WordPiece trainer will create
    from a text: the characters that occur inside a word, after its normalizer and pre-tokenizer.

    Each new character is probed once through the tokenizer's normalizer and pre-tokenizer: can it
    join a word, and which characters does it become there (``c * 3``) and on its own (``c``; what
    follows the first character is inside its word). A character's in-word forms count once it is
    seen right after a character that joins words (characters the normalizer removes are skipped),
    which one regular expression per chunk looks for; after the first chunks only rare characters
    are still waiting to be seen there."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.seen: set[str] = set()
        self.inside: dict[str, set[str]] = {}  # character that stays inside a word -> what it becomes there
        self.found: set[str] = set()
        self.waiting: set[str] = set()  # joining characters not yet seen after another
        self.dropped: set[str] = set()  # characters the normalizer removes

    def _inside(self, text: str) -> tuple[int, set[str]]:
        words = self.tok.pre_tokenizer.pre_tokenize_str(self.tok.normalizer.normalize_str(text))
        return len(words), {c for word, _ in words for c in word[1:]}

    def update(self, text: str) -> None:
        chars = set(text)
        for c in chars - self.seen:
            self.seen.add(c)
            if not self.tok.normalizer.normalize_str(c):
                self.dropped.add(c)
                continue
            n_words, inside = self._inside(c * 3)
            self.found |= self._inside(c)[1]
            if n_words == 1:
                self.inside[c] = inside
                self.waiting.add(c)
        look_for = chars & self.waiting
        if not look_for:
            return
        if self.dropped:
            text = re.sub(f"[{_class(self.dropped)}]", "", text)
        for c in set(re.findall(f"[{_class(look_for)}](?<=[{_class(self.inside)}].)", text, re.DOTALL)):
            self.found |= self.inside[c]
            self.waiting.discard(c)

    def pieces(self) -> list[str]:
        return sorted(CONTINUATION + c for c in self.found)


def _class(chars: Iterable[str]) -> str:
    """The inside of a regular-expression character class matching ``chars``."""
    return "".join(re.escape(c) for c in sorted(chars))


def _chunks(items: Iterable[str], n: int) -> Iterable[list[str]]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def single_char_pieces(tok: Tokenizer) -> list[str]:
    """The vocabulary's continuation pieces of one character (``##e``)."""
    n = len(CONTINUATION) + 1
    return [t for t in tok.get_vocab() if len(t) == n and t.startswith(CONTINUATION)]


def _limit(items: Iterable[str], n: int | None) -> Iterable[str]:
    for i, item in enumerate(items):
        if n is not None and i >= n:
            return
        yield item


class TokenizerFileError(ValueError):
    """A file that should be a tokenizer.json and is not one."""


def load_tokenizer(path: str | Path, fix: str) -> Tokenizer:
    """``Tokenizer.from_file`` with an error that names the file, what is wrong and ``fix``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such tokenizer file. {fix}")
    if path.stat().st_size == 0:
        raise TokenizerFileError(f"{path} is empty (0 bytes). {fix}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for any parse error
        raise TokenizerFileError(f"{path} is not a tokenizers tokenizer.json ({str(e).strip()[:200]}). {fix}") from None
