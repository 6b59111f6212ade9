"""Corpora: where documents come from. Every corpus yields documents as lists of sentences.

    SyntheticCorpus   the embedded artificial language (default; offline; seconds to build)
    TextFiles         local .txt / .jsonl / .json / .parquet files, loaded through ``datasets``
    HubCorpus         Hugging Face hub datasets (WikiText-103, Wikipedia + books), optionally streamed

A corpus is a config object (its fields are its identity, hashed into ``fingerprint()``) with
``documents(cache_dir)`` returning a ``datasets.Dataset`` with one column, ``sentences``
(list of str), one row per document; or, when ``streaming``, an iterable of such rows.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pretrainlab.data.hashing import file_digest, fingerprint
from pretrainlab.data.hub import hub_offline
from pretrainlab.data.synthetic import GENERATOR_VERSION, SyntheticLanguage, generate_documents

if TYPE_CHECKING:  # imported where a corpus is read: a packed corpus (data=packed) needs no ``datasets``
    import datasets

# --- sentence splitting ------------------------------------------------------------------------

_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "st",
    "prof",
    "sr",
    "jr",
    "vs",
    "etc",
    "no",
    "vol",
    "fig",
    "e.g",
    "i.e",
    "mt",
}
# A sentence ends at . ! or ? (optionally followed by closing quotes/brackets), then whitespace,
# then something that can start a sentence: an upper-case letter, a digit, or an opening quote.
_BOUNDARY = re.compile(r"(?<=[.!?])([\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]*[A-Z0-9])")
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences. Paragraph breaks (blank lines) always end a sentence;
    single line breaks inside a paragraph are joined (hard-wrapped books)."""
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        start = 0
        for m in _BOUNDARY.finditer(paragraph):
            end = m.start() + len(m.group(1))
            prev_word = paragraph[start : m.start()].rsplit(" ", 1)[-1].rstrip(".").lower()
            if prev_word in _ABBREVIATIONS or (len(prev_word) == 1 and prev_word.isalpha()):
                continue  # "Mr. Smith", "J. Austen": not a sentence end
            sentences.append(paragraph[start:end].strip())
            start = m.end()
        tail = paragraph[start:].strip()
        if tail:
            sentences.append(tail)
    return [s for s in sentences if s]


def strip_gutenberg_boilerplate(text: str) -> str:
    """The book between Project Gutenberg's START and END markers (the text as is without them)."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


def _split_batch(batch: dict[str, list], text_column: str, strip_gutenberg: bool) -> dict[str, list]:
    out = []
    for text in batch[text_column]:
        text = text or ""
        if strip_gutenberg:
            text = strip_gutenberg_boilerplate(text)
        out.append(split_sentences(text))
    return {"sentences": out}


def _sentences_dataset(
    ds: datasets.Dataset, text_column: str, strip_gutenberg: bool, num_proc: int | None, cache_file: str | None
) -> datasets.Dataset:
    if text_column not in ds.column_names:
        raise ValueError(
            f"the corpus has no column {text_column!r} (columns: {ds.column_names}); set data.text_column."
        )
    # worker processes pay off only with a few documents for each
    parallel = num_proc if num_proc and num_proc > 1 and len(ds) >= 2 * num_proc else None
    # map(num_proc=...) sets TOKENIZERS_PARALLELISM=false for its workers and leaves it set in this
    # process (when its result is cached; otherwise it rebinds os.environ to a copy, which does not
    # reach the C environment the Rust tokenizers read): they would train and encode on one core
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    try:
        return ds.map(
            _split_batch,
            batched=True,
            batch_size=16,
            remove_columns=ds.column_names,
            num_proc=parallel,
            fn_kwargs={"text_column": text_column, "strip_gutenberg": strip_gutenberg},
            cache_file_name=cache_file,
            desc="splitting sentences",
        )
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
            os.unsetenv("TOKENIZERS_PARALLELISM")  # also when the rebound copy lacks the key
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


# --- corpora -----------------------------------------------------------------------------------


class CorpusError(ValueError):
    """A corpus that cannot be read or cannot give a pretraining run what it needs."""


def _caused_by(e: BaseException | None, kind: type) -> bool:
    while e is not None:
        if isinstance(e, kind):
            return True
        e = e.__cause__ or e.__context__
    return False


def _first_invalid_utf8(files: list[Path]) -> str:
    """A message naming the first file that is not valid UTF-8, where, and what to do."""
    for f in files:
        data = f.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            return (
                f"{f} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}) cannot be "
                f"decoded. Fix or re-encode the file (e.g. iconv -f latin1 -t utf-8), or set "
                f"data.encoding_errors=replace to read each undecodable byte as U+FFFD."
            )
    return "a data file is not valid UTF-8; set data.encoding_errors=replace to read undecodable bytes as U+FFFD."


def _invalid_utf8(files: list[Path]) -> str | None:
    """The message of :func:`_first_invalid_utf8` for the first file that is not valid UTF-8 (read a
    megabyte at a time), or None when every one is."""
    import codecs

    for f in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return _first_invalid_utf8([f])
    return None


def _first_invalid_json(files: list[Path], text_column: str) -> str | None:
    """A message naming the first .jsonl/.json file that the JSON loader cannot read, the line and
    what is wrong; None when every file reads (the failure lay elsewhere)."""
    import json

    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix.lower() == ".json" and text.lstrip()[:1] in ("[", "{") and "\n" not in text.strip():
            try:
                json.loads(text)
                continue
            except ValueError as e:
                return f"{f} is not valid JSON ({e}). Repair it, or remove it from data.files."
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                return (
                    f"{f}, line {n}: not a complete JSON object ({e}): {line[:80]!r}. Each line of a JSON lines "
                    f"file must be one JSON object with a {text_column!r} field: repair or remove that line."
                )
            if not isinstance(row, dict):
                return (
                    f"{f}, line {n}: a JSON {type(row).__name__}, not an object with a {text_column!r} field. "
                    f"Repair or remove that line."
                )
    return None


def _has_blank_line(path: Path, chunk: int = 1 << 20) -> bool:
    blank = re.compile(rb"\n[ \t\r]*\n")
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            if blank.search(tail + block):
                return True
            tail = block[-64:]
    return False


class Corpus:
    streaming: bool = False

    def few_documents_hint(self) -> str:
        """What to do when the corpus has fewer than 2 documents (a held-out split needs 2)."""
        return "a held-out split needs at least 2: use a larger corpus."

    def key(self) -> dict:
        return {"corpus": type(self).__name__, **asdict(self)}  # type: ignore[call-overload]  # every corpus is a dataclass

    def fingerprint(self) -> str:
        return fingerprint(self.key())

    def documents(self, cache_dir: Path) -> datasets.Dataset | Iterable[dict]:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclass
class SyntheticCorpus(Corpus):
    """The artificial language of ``pretrainlab.data.synthetic``; ``num_documents`` sets the size."""

    num_documents: int = 2000
    min_sentences: int = 8
    max_sentences: int = 20
    num_topics: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.num_documents, int) or self.num_documents < 2:
            raise ValueError(
                f"data.num_documents={self.num_documents!r}: must be an integer of at least 2 (a held-out "
                f"split needs 2 documents)."
            )
        if not 1 <= self.min_sentences <= self.max_sentences:
            raise ValueError(
                f"data.min_sentences={self.min_sentences} and data.max_sentences={self.max_sentences}: "
                f"need 1 <= min_sentences <= max_sentences."
            )
        if self.num_topics < 1:
            raise ValueError(f"data.num_topics={self.num_topics}: must be at least 1.")

    def key(self) -> dict:
        return {**super().key(), "generator_version": GENERATOR_VERSION}

    def documents(self, cache_dir: Path) -> datasets.Dataset:
        import datasets

        language = SyntheticLanguage(seed=self.seed, num_topics=self.num_topics)
        texts = generate_documents(self.num_documents, self.min_sentences, self.max_sentences, language)
        return datasets.Dataset.from_dict({"sentences": [split_sentences(t) for t in texts]})

    def describe(self) -> str:
        return f"synthetic language ({self.num_documents} documents, seed {self.seed})"


_LOADERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _loader(path: Path) -> str | None:
    """How a corpus file is read, by its extension; a file without one is plain text (the layout of
    many news and web corpora: a folder of numbered files). In a folder, files without an extension
    are read only when no file there has a supported one."""
    return "text" if path.suffix == "" else _LOADERS.get(path.suffix.lower())


def _hidden(path: Path, root: Path) -> bool:
    """Whether a file sits in a hidden folder below ``root`` (.git, .cache, ...)."""
    return any(part.startswith(".") for part in path.relative_to(root).parts[:-1])


def _corpus_file(path: Path) -> bool:
    """A file of a corpus folder: a supported extension, or none (hidden files are left out)."""
    return path.is_file() and not path.name.startswith(".") and _loader(path) is not None


@dataclass
class TextFiles(Corpus):
    """Local files. ``.txt``: one document per file (``doc_split: file``) or documents separated by
    blank lines (``doc_split: blank_line``). ``.jsonl``/``.json``/``.parquet``: one document per
    row, text in ``text_column``. Paths may be globs or directories (all supported files below)."""

    files: list[str] | str = field(default_factory=list)
    doc_split: str = "file"
    text_column: str = "text"
    strip_gutenberg: bool = True
    num_proc: int | None = None
    encoding_errors: str = "strict"  # strict: invalid UTF-8 stops the run; replace: U+FFFD for each bad byte

    def __post_init__(self) -> None:
        if isinstance(self.files, str):
            self.files = [self.files]
        self.files = [str(f) for f in self.files]
        if self.doc_split not in ("file", "blank_line"):
            raise ValueError(f"data.doc_split must be 'file' or 'blank_line', got {self.doc_split!r}.")
        if self.encoding_errors not in ("strict", "replace"):
            raise ValueError(f"data.encoding_errors must be 'strict' or 'replace', got {self.encoding_errors!r}.")

    def resolve(self) -> list[Path]:
        if not self.files:
            raise FileNotFoundError(
                "data=text needs files: pass data.files=[path/to/a.txt,...] (files, directories or globs)."
            )
        found: list[Path] = []
        for pattern in self.files:
            p = Path(os.path.expanduser(pattern))
            if p.is_dir():
                inside = [q for q in p.rglob("*") if _corpus_file(q) and not _hidden(q, p)]
                typed = [q for q in inside if q.suffix != ""]
                # files without an extension are the corpus only where nothing has one (a README beside
                # .txt books is not a book)
                found += sorted(typed or inside)
            elif any(ch in pattern for ch in "*?["):
                found += sorted(Path(m) for m in glob.glob(os.path.expanduser(pattern), recursive=True))
            elif p.is_file():
                found.append(p)
            else:
                raise FileNotFoundError(f"data.files: {pattern} does not exist.")
        if not found:
            raise FileNotFoundError(
                f"data.files={self.files} matched no .txt/.jsonl/.json/.parquet file (nor a text file without an extension)."
            )
        kinds = {_loader(p) for p in found}
        if None in kinds:
            bad = [str(p) for p in found if _loader(p) is None][:3]
            raise ValueError(
                f"unsupported file type: {bad}; use .txt, .jsonl, .json or .parquet (a file without an extension is "
                "read as text)."
            )
        if len(kinds) > 1:
            raise ValueError(f"data.files mixes file types {sorted(str(k) for k in kinds)}; use one type per corpus.")
        empty = [str(p) for p in found if p.stat().st_size == 0]
        if empty:
            raise ValueError(f"empty data file(s): {empty[:5]}; remove them from data.files.")
        return sorted(set(found))

    def key(self) -> dict:
        """The files' contents (path below their common folder, size, sha256), not their modification
        times: a corpus copied to another machine or restored from a backup is the same corpus, and a
        file edited in place (even to the same size) is another. Each file is read once per process
        while it is unchanged (``file_digest``): about a second per 1.5 GB."""
        files = [p.resolve() for p in self.resolve()]
        root = Path(os.path.commonpath([p.parent for p in files]))
        stats = [(p.relative_to(root).as_posix(), p.stat().st_size, file_digest(p)) for p in files]
        key = {
            "corpus": "TextFiles",
            "files": stats,
            "doc_split": self.doc_split,
            "text_column": self.text_column,
            "strip_gutenberg": self.strip_gutenberg,
        }
        if self.encoding_errors != "strict":
            key["encoding_errors"] = self.encoding_errors
        return key

    def documents(self, cache_dir: Path) -> datasets.Dataset:
        files = self.resolve()
        loader = _loader(files[0])
        if loader in ("text", "json") and self.encoding_errors == "strict" and (problem := _invalid_utf8(files)):
            raise CorpusError(problem)  # before anything else is said of text that is not text
        if loader == "text" and self.doc_split == "file" and len(files) < 2:
            raise CorpusError(
                f"data.files={self.files} is one .txt file, and with data.doc_split=file that is one "
                f"document; {self.few_documents_hint()}"
            )
        import datasets

        kwargs: dict[str, Any] = {}
        column = self.text_column
        if loader == "text":
            kwargs["sample_by"] = "document" if self.doc_split == "file" else "paragraph"
            kwargs["keep_linebreaks"] = True
            column = "text"
        if loader in ("text", "json") and self.encoding_errors != "strict":
            kwargs["encoding_errors"] = self.encoding_errors
        try:
            ds = datasets.load_dataset(
                loader,
                data_files=[str(f) for f in files],
                split="train",
                cache_dir=str(cache_dir / "hf-datasets"),
                **kwargs,
            )
        except Exception as e:  # noqa: BLE001 - re-raised naming the file and line when they can be found
            if loader != "parquet" and _caused_by(e, UnicodeDecodeError):
                raise CorpusError(_first_invalid_utf8(files)) from None
            problem = _first_invalid_json(files, self.text_column) if loader == "json" else None
            if problem:
                raise CorpusError(problem) from None
            raise
        cache_dir.mkdir(parents=True, exist_ok=True)
        out = _sentences_dataset(
            ds,
            column,
            self.strip_gutenberg,
            self.num_proc or os.cpu_count(),
            str(cache_dir / f"sentences-{self.fingerprint()}.arrow"),
        )
        return out

    def describe(self) -> str:
        files = self.resolve()
        bare = sum(1 for f in files if f.suffix == "")
        how = f" ({bare} without an extension, read as plain text)" if bare else ""
        return f"{len(files)} local file(s){how}"

    def few_documents_hint(self) -> str:
        files = self.resolve()
        if _loader(files[0]) != "text":
            return "a held-out split needs at least 2, and each row of the files is a document: add rows or files."
        if self.doc_split == "file":
            if any(_has_blank_line(f) for f in files):
                return (
                    "a held-out split needs at least 2. The text has blank lines: data.doc_split=blank_line "
                    "makes each block between blank lines a document; or add files (one document each)."
                )
            return (
                "a held-out split needs at least 2. The text has no blank lines, so data.doc_split=blank_line "
                "would not split it either: add files (a directory of .txt files, one document each), or split "
                "the text into several files."
            )
        return "a held-out split needs at least 2: add files, or separate documents with blank lines."


@dataclass
class HubSource:
    path: str
    name: str | None = None
    split: str = "train"
    text_column: str = "text"
    data_files: list[str] | str | None = None  # e.g. a subset of a hub dataset's files
    # WikiText stores one line per row with " = Title = " headings between articles
    doc_split: str = "row"  # row | wikitext_headings


@dataclass
class HubCorpus(Corpus):
    """Datasets from the Hugging Face hub, concatenated. ``streaming: true`` reads them lazily
    (nothing is downloaded in full), for corpora that do not fit on disk; ``max_documents``
    caps how many documents are used (per source)."""

    sources: list[dict] = field(default_factory=list)
    streaming: bool = False
    max_documents: int | None = None
    strip_gutenberg: bool = False

    def _sources(self) -> list[HubSource]:
        if not self.sources:
            raise ValueError("data.sources is empty: list at least one {path: ..., name: ...} hub dataset.")
        return [HubSource(**dict(s)) for s in self.sources]

    def _load(self, src: HubSource, cache_dir: Path):
        import datasets

        try:
            return datasets.load_dataset(
                src.path,
                src.name,
                split=src.split,
                streaming=self.streaming,
                data_files=src.data_files,
                cache_dir=str(cache_dir / "hf-datasets"),
            )
        except Exception as e:  # noqa: BLE001 - re-raised with what to do
            offline = hub_offline()
            raise ConnectionError(
                f"could not load the hub dataset {src.path}"
                f"{'/' + src.name if src.name else ''} ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
                + ("HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set. " if offline else "")
                + "This corpus needs the Hugging Face hub (network access, or a populated HF cache). "
                "Offline, use data=synthetic or data=text data.files=[...]."
            ) from e

    def _documents_of(self, src: HubSource, ds) -> Iterable[str]:
        if src.doc_split == "wikitext_headings":
            yield from _wikitext_articles(row[src.text_column] for row in ds)
        else:
            for row in ds:
                yield row[src.text_column]

    def iter_documents(self, cache_dir: Path, shard: tuple[int, int] | None = None) -> Iterable[dict]:
        """Documents of every source in order. ``shard=(index, count)`` keeps one of ``count``
        disjoint parts: a streamed source goes through ``datasets.distributed.split_dataset_by_node``
        (whole files per part when the file count allows, else every count-th row); WikiText, whose
        articles span rows, is sharded by article."""
        from datasets.distributed import split_dataset_by_node

        for src in self._sources():
            ds = self._load(src, cache_dir)
            row_documents = src.doc_split != "wikitext_headings"
            if row_documents and shard is not None and self.streaming:
                ds = split_dataset_by_node(ds, rank=shard[0], world_size=shard[1])
            for n, text in enumerate(self._documents_of(src, ds)):
                if self.max_documents is not None and n >= self.max_documents:
                    break
                if not row_documents and shard is not None and n % shard[1] != shard[0]:
                    continue
                if self.strip_gutenberg:
                    text = strip_gutenberg_boilerplate(text)
                sentences = split_sentences(text)
                if sentences:
                    yield {"sentences": sentences}

    def documents(self, cache_dir: Path):
        if self.streaming:
            return _Reiterable(self, cache_dir)
        import datasets

        return datasets.Dataset.from_generator(
            self.iter_documents,
            gen_kwargs={"cache_dir": cache_dir},
            cache_dir=str(cache_dir / "hf-datasets"),
        )

    def describe(self) -> str:
        return "hub: " + ", ".join(s["path"] for s in self.sources)


class _Reiterable:
    """A streamed corpus that can be iterated more than once (each pass re-opens the stream)."""

    def __init__(self, corpus: HubCorpus, cache_dir: Path):
        self.corpus, self.cache_dir = corpus, cache_dir

    def __iter__(self):
        return iter(self.corpus.iter_documents(self.cache_dir))

    def iter(self, shard: tuple[int, int] | None = None):
        return iter(self.corpus.iter_documents(self.cache_dir, shard=shard))


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def _wikitext_articles(lines: Iterable[str]) -> Iterable[str]:
    """WikiText rows are lines; an article starts at a level-1 heading `` = Title = ``."""
    article: list[str] = []
    for line in lines:
        if _WIKITEXT_TITLE.match(line.rstrip("\n")) and article:
            yield "\n".join(article)
            article = []
        stripped = line.strip()
        if stripped and not stripped.startswith("="):
            article.append(stripped + "\n")  # each WikiText line is a paragraph
    if article:
        yield "\n".join(article)
