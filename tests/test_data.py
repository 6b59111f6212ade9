import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, trainers

from pretrainlab.data.batches import EpochBatches
from pretrainlab.data.corpus import HubCorpus, SyntheticCorpus, TextFiles, split_sentences, strip_gutenberg_boilerplate
from pretrainlab.data.packing import PackedBlocks
from pretrainlab.data.pipeline import PretrainData
from pretrainlab.data.synthetic import STAGES
from pretrainlab.data.tokenizer import ContinuationScan, TokenizerSpec, single_char_pieces
from pretrainlab.tokens import SPECIALS, special_tokens


def test_sentence_splitting():
    text = 'Mr. Smith went to Washington. He said "Stop!" Then he left.\nThis line is\nwrapped.\n\nNew paragraph'
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.",
        'He said "Stop!"',
        "Then he left.",
        "This line is wrapped.",
        "New paragraph",
    ]


def test_gutenberg_boilerplate_is_stripped():
    book = "Header\nlicence\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nThe story. It ends.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence"
    assert split_sentences(strip_gutenberg_boilerplate(book)) == ["The story.", "It ends."]


def test_synthetic_corpus_is_seeded_and_ordered(tmp_path):
    a = SyntheticCorpus(num_documents=50, seed=3).documents(tmp_path)
    b = SyntheticCorpus(num_documents=50, seed=3).documents(tmp_path)
    c = SyntheticCorpus(num_documents=50, seed=4).documents(tmp_path)
    assert a["sentences"] == b["sentences"] and a["sentences"] != c["sentences"]
    for doc in a["sentences"]:
        assert 8 <= len(doc) <= 20
        # discourse order: stage markers never go back within a document
        stages = [STAGES.index(s.split()[0].lower()) for s in doc if s.split()[0].lower() in STAGES]
        assert stages == sorted(stages) and stages[0] == 0 and stages[-1] == len(STAGES) - 1


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_text_files_one_document_per_file_or_per_blank_line(tmp_path):
    (tmp_path / "corpus").mkdir()
    write(tmp_path / "corpus" / "a.txt", "First doc. Two sentences.\n\nStill first doc.")
    write(tmp_path / "corpus" / "b.txt", "Second doc here.")
    per_file = TextFiles(files=[str(tmp_path / "corpus")], doc_split="file").documents(tmp_path / "c1")
    assert sorted(map(len, per_file["sentences"])) == [1, 3]
    per_para = TextFiles(files=[str(tmp_path / "corpus" / "*.txt")], doc_split="blank_line").documents(tmp_path / "c2")
    assert len(per_para) == 3


def test_invalid_utf8_is_named_with_its_file_and_offset_or_replaced_on_request(tmp_path):
    from pretrainlab.data.corpus import CorpusError

    (tmp_path / "books").mkdir()
    for i in range(3):
        write(tmp_path / "books" / f"book{i}.txt", f"Book {i} begins. It goes on.\nAnd on.")
    bad = tmp_path / "books" / "book1.txt"
    bad.write_bytes(b"Book 1 begins.\nIt costs 5 \xa3 here.\n")  # a latin-1 pound sign
    with pytest.raises(CorpusError) as e:
        TextFiles(files=[str(tmp_path / "books")]).documents(tmp_path / "c1")
    message = str(e.value)
    assert str(bad) in message and "offset 26 (line 2)" in message and "data.encoding_errors=replace" in message
    docs = TextFiles(files=[str(tmp_path / "books")], encoding_errors="replace").documents(tmp_path / "c2")
    assert any("\ufffd" in s for doc in docs["sentences"] for s in doc) and len(docs) == 3
    assert (
        TextFiles(files=[str(tmp_path / "books")], encoding_errors="replace").fingerprint()
        != TextFiles(files=[str(tmp_path / "books")]).fingerprint()
    )
    # one file of random bytes: named as not UTF-8, not advised to split its "documents" at blank lines
    noise = tmp_path / "noise.txt"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    with pytest.raises(CorpusError, match=f"{noise} is not valid UTF-8: byte 0x.. at offset"):
        TextFiles(files=[str(noise)]).documents(tmp_path / "c3")


@pytest.mark.parametrize("blank_lines", [False, True])
def test_a_one_document_corpus_is_refused_before_any_work_with_advice_that_fits(tmp_path, monkeypatch, blank_lines):
    from pretrainlab.data.corpus import CorpusError

    text = ("Sentence one of the only document. " * 50) + ("\n\n" if blank_lines else " ") + "More of it."
    write(tmp_path / "one.txt", text)

    def no_loading(*a, **k):
        raise AssertionError("the file was loaded before its document count was checked")

    monkeypatch.setattr("datasets.load_dataset", no_loading)
    data = PretrainData(TextFiles(files=[str(tmp_path / "one.txt")]), TokenizerSpec(vocab_size=100), tmp_path)
    with pytest.raises(CorpusError, match="one document") as e:
        data.tokenizer  # noqa: B018 - training the tokenizer is the first thing that reads the corpus
    if blank_lines:
        assert "The text has blank lines: data.doc_split=blank_line" in str(e.value)
    else:
        assert "would not split it either" in str(e.value) and "add files" in str(e.value)
    assert not list(tmp_path.rglob("tokenizer.json"))  # nothing was trained


def test_jsonl_and_parquet_with_a_text_column(tmp_path):
    rows = [{"body": "Alpha one. Alpha two."}, {"body": "Beta one."}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    docs = TextFiles(files=[str(tmp_path / "d.jsonl")], text_column="body").documents(tmp_path / "c1")
    assert docs["sentences"] == [["Alpha one.", "Alpha two."], ["Beta one."]]
    pq.write_table(pa.table({"body": [r["body"] for r in rows]}), tmp_path / "d.parquet")
    docs = TextFiles(files=[str(tmp_path / "d.parquet")], text_column="body").documents(tmp_path / "c2")
    assert len(docs) == 2
    with pytest.raises(ValueError, match="no column 'text'"):
        TextFiles(files=[str(tmp_path / "d.parquet")]).documents(tmp_path / "c3")


def test_a_malformed_json_lines_corpus_names_its_file_and_line(tmp_path):
    from pretrainlab.data.corpus import CorpusError

    good = "\n".join(json.dumps({"text": f"Document {i}. It goes on."}) for i in range(20))
    (tmp_path / "a.jsonl").write_text(good + "\n")
    lines = [json.dumps({"text": f"Other {i}."}) for i in range(12)]
    lines[8] = '{"text": "cut off in the midd'
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        CorpusError,
        match=r"b.jsonl, line 9: not a complete JSON object .*'text' field: repair or "
        r"remove that line",
    ):
        TextFiles(files=[str(tmp_path)]).documents(tmp_path / "cache")
    lines[8] = json.dumps(["a", "list"])
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"b.jsonl, line 9: a JSON list, not an object"):
        TextFiles(files=[str(tmp_path)]).documents(tmp_path / "cache2")


def test_missing_and_empty_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextFiles(files=[str(tmp_path / "nope.txt")]).resolve()
    with pytest.raises(FileNotFoundError, match="needs files"):
        TextFiles(files=[]).resolve()
    write(tmp_path / "empty.txt", "")
    with pytest.raises(ValueError, match="empty data file"):
        TextFiles(files=[str(tmp_path / "empty.txt")]).resolve()
    write(tmp_path / "blank.txt", "   \n\n  ")
    data = PretrainData(TextFiles(files=[str(tmp_path / "blank.txt")]), TokenizerSpec(), tmp_path / "cache")
    with pytest.raises(ValueError, match="no documents|no tokens|empty"):
        _ = data.tokenized


def test_hub_corpus_offline_fails_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    corpus = HubCorpus(sources=[{"path": "Salesforce/wikitext", "name": "wikitext-103-raw-v1"}])
    with pytest.raises(ConnectionError, match="needs the Hugging Face hub.*data=synthetic"):
        list(corpus.iter_documents(tmp_path))


def test_tokenizer_and_tokenized_corpus_are_cached(tmp_path, monkeypatch):
    corpus = SyntheticCorpus(num_documents=60)
    spec = TokenizerSpec(vocab_size=500)
    first = PretrainData(corpus, spec, tmp_path)
    docs1 = first.tokenized
    tokenizer_files = list((tmp_path / "tokenizers").rglob("tokenizer.json"))
    assert len(tokenizer_files) == 1

    # a second run must neither train a tokenizer nor tokenize again
    def boom(*a, **k):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(TokenizerSpec, "train", boom)
    monkeypatch.setattr("pretrainlab.data.pipeline._tokenize_batch", boom)
    second = PretrainData(corpus, spec, tmp_path)
    assert second.tokenizer.to_str() == first.tokenizer.to_str()
    assert np.array_equal(second.tokenized.tokens, docs1.tokens)
    # different settings or a different corpus: a different cache entry
    third = PretrainData(corpus, TokenizerSpec(vocab_size=400), tmp_path)
    monkeypatch.undo()
    _ = third.tokenizer
    assert len(list((tmp_path / "tokenizers").rglob("tokenizer.json"))) == 2


def test_bpe_and_pretrained_tokenizers(tmp_path):
    corpus = SyntheticCorpus(num_documents=40)
    bpe = PretrainData(corpus, TokenizerSpec(kind="bpe", vocab_size=600), tmp_path)
    tokens = special_tokens(bpe.tokenizer)
    assert tokens.is_continuation.any() and not tokens.is_continuation.all()
    path = tmp_path / "tok.json"
    bpe.tokenizer.save(str(path))
    loaded = PretrainData(corpus, TokenizerSpec(kind="pretrained", path=str(path)), tmp_path)
    assert loaded.tokenizer.get_vocab() == bpe.tokenizer.get_vocab()
    with pytest.raises(ValueError, match="no mask token '<mask>'"):
        special_tokens(loaded.tokenizer, {"mask": "<mask>"})
    with pytest.raises(FileNotFoundError, match="tokenizer.path"):
        TokenizerSpec(kind="pretrained", path=str(tmp_path / "missing.json")).key("x")


# text with what makes continuation pieces hard to predict: removed characters (a left-to-right
# mark, a byte-order mark, a combining accent when lowercasing), symbols that stand alone or join,
# Greek capitals, a dotted capital I, CJK characters (split off), punctuation, full-width letters
AWKWARD = [
    "The ΟΔΟΣ of Ἀθῆναι, and £5 at 45° is ½ the café's naïve price.",
    "x\u200eי and ☉ ☉ ♂ so İstanbul",
    "e\u0301t\u0301e 日本語 don't ALL-CAPS 3.14 ｆｕｌｌ－ｗｉｄｔｈ \ufeffbom",
] * 3


def native(spec: TokenizerSpec, sentences: list[str]) -> Tokenizer:
    """tokenizers' own WordPiece training."""
    tok = spec._wordpiece()
    tok.train_from_iterator(
        sentences,
        trainers.WordPieceTrainer(
            vocab_size=spec.vocab_size,
            min_frequency=spec.min_frequency,
            special_tokens=list(SPECIALS.values()),
            show_progress=False,
        ),
    )
    return tok


@pytest.mark.parametrize("lowercase", [True, False])
def test_continuation_scan_predicts_the_trainers_pieces(lowercase):
    spec = TokenizerSpec(vocab_size=100, lowercase=lowercase)
    scan = ContinuationScan(spec._wordpiece())
    for text in AWKWARD:
        scan.update(text)
    assert set(scan.pieces()) == set(single_char_pieces(native(spec, AWKWARD)))
    # seen through the removed mark, after the joining "£", and no piece for a symbol standing alone
    assert {"##י", "##5"} <= set(scan.pieces()) and "##☉" not in scan.pieces()


def test_tokenizer_training_is_reproducible(tmp_path):
    """tokenizers' WordPiece trainer alone ends with a different vocabulary on almost every run
    (huggingface/tokenizers#1794); trained here, the same text gives the same tokenizer."""
    sentences = list(PretrainData(SyntheticCorpus(num_documents=200), TokenizerSpec(), tmp_path).sentences())
    sentences += AWKWARD
    spec = TokenizerSpec(vocab_size=1000)
    trained = [spec.train(iter(sentences), workdir=tmp_path).to_str() for _ in range(5)]
    assert len(set(trained)) == 1
    assert not list(tmp_path.glob(".wordpiece-*"))  # the spooled sentences are gone
    tok = Tokenizer.from_str(trained[0])
    # the pieces handed to the trainer are ordinary vocabulary again, exactly those it creates itself
    assert sorted(t.content for t in tok.get_added_tokens_decoder().values()) == sorted(SPECIALS.values())
    reference = native(spec, sentences)
    assert set(single_char_pieces(tok)) == set(single_char_pieces(reference))
    assert tok.get_vocab_size() == reference.get_vocab_size() > 400
    assert tok.token_to_id("##a") is not None and "##a" not in tok.encode("the ##a").tokens
    bpe = TokenizerSpec(kind="bpe", vocab_size=600)
    assert len({bpe.train(iter(sentences)).to_str() for _ in range(3)}) == 1


def test_wordpiece_pieces_the_scan_missed_are_trained_again(tmp_path, monkeypatch):
    sentences = list(PretrainData(SyntheticCorpus(num_documents=100), TokenizerSpec(), tmp_path).sentences())
    spec = TokenizerSpec(vocab_size=600)
    expected = spec.train(iter(sentences)).to_str()
    complete = ContinuationScan.pieces
    monkeypatch.setattr(ContinuationScan, "pieces", lambda self: complete(self)[::2])
    assert spec.train(iter(sentences)).to_str() == expected


def test_examples_are_cached_and_splits_are_disjoint(tmp_path):
    data = PretrainData(SyntheticCorpus(num_documents=80), TokenizerSpec(vocab_size=500), tmp_path, val_fraction=0.1)
    train, val = data.split_indices("train"), data.split_indices("val")
    assert len(val) == 8 and not set(train) & set(val) and len(train) + len(val) == 80
    tokens = special_tokens(data.tokenizer)
    builder = PackedBlocks(64, tokens.cls_id, tokens.sep_id)
    store = data.examples(builder, "train")
    assert len(list((tmp_path / "examples").iterdir())) >= 1
    again = PretrainData(SyntheticCorpus(num_documents=80), TokenizerSpec(vocab_size=500), tmp_path, val_fraction=0.1)
    assert np.array_equal(again.examples(builder, "train")[3]["input_ids"], store[3]["input_ids"])
    n_train_tokens = sum(len(s) for d in train for s in data.tokenized[int(d)])
    body = store.columns["input_ids"][0]
    assert int(np.sum(body > 4)) == n_train_tokens  # packing kept every training token


def test_batches_cover_each_epoch_once_and_ranks_are_disjoint():
    n, bs = 103, 8
    seen = []
    for rank in range(2):
        sampler = EpochBatches(n, bs, seed=1, rank=rank, world_size=2)
        sampler.set_epoch(3)
        seen.append([i for key in sampler for i in key.example_ids])
    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) == len(seen[1]) == (n // (bs * 2)) * bs
    epoch4 = EpochBatches(n, bs, seed=1)
    epoch4.set_epoch(4)
    epoch3 = EpochBatches(n, bs, seed=1)
    epoch3.set_epoch(3)
    assert [k.example_ids for k in epoch3] != [k.example_ids for k in epoch4]
    with pytest.raises(ValueError, match="no full batch"):
        EpochBatches(5, 8, seed=0)


def test_streamed_corpus_trains_end_to_end(tmp_path, own_cache):
    """The streaming path (hub presets with streaming: true) on a local file: documents are read
    lazily, tokenized on the fly, built into examples in buffers and masked."""
    from omegaconf import OmegaConf

    from pretrainlab.data.synthetic import SyntheticLanguage, generate_documents
    from pretrainlab.pretraining.run import run
    from tests.conftest import SMALL, compose_train

    texts = generate_documents(400, 8, 12, SyntheticLanguage(seed=5))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    small = [o for o in SMALL if not o.startswith("data.")]
    cfg = compose_train(*small, "data=wikibooks", "max_steps=6", "val_every=3", "checkpoint_every=3")
    OmegaConf.update(cfg, "data.sources", [{"path": "json", "data_files": [str(path)], "text_column": "text"}])
    result = run(cfg, tmp_path / "run")
    assert result["global_step"] == 6 and result["val/mlm_acc"] >= 0
    assert (own_cache / "tokenizers").is_dir()  # the tokenizer was trained on the stream and cached
    assert not (own_cache / "tokenized").exists()  # the corpus itself is never materialised


def test_parallel_sentence_splitting_leaves_the_tokenizers_parallel(tmp_path, monkeypatch):
    """datasets' map(num_proc=...) turns TOKENIZERS_PARALLELISM off for its workers and leaves it off
    in this process; the Rust tokenizers (which read the C environment) would then run on one core."""
    import subprocess

    import datasets

    from pretrainlab.data.corpus import _sentences_dataset

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    ds = datasets.Dataset.from_dict({"text": [f"Document {i} starts. It ends." for i in range(8)]})
    cache = str(tmp_path / "sentences.arrow")
    for attempt in ("computed", "cached"):
        out = _sentences_dataset(ds, "text", False, 2, cache)
        assert len(out) == 8 and "TOKENIZERS_PARALLELISM" not in os.environ, attempt
        seen = subprocess.run(["sh", "-c", "echo ${TOKENIZERS_PARALLELISM-unset}"], capture_output=True, text=True)
        assert seen.stdout.strip() == "unset", attempt  # a child inherits the C environment


def test_a_file_is_hashed_once_per_version_of_it(tmp_path, monkeypatch):
    """A suite checks its encoder's weights before and after every task and seed: read once while
    the file is unchanged, again once it is replaced or modified in place."""
    import hashlib

    from pretrainlab.data import hashing

    reads = []
    real = hashlib.sha256
    monkeypatch.setattr(hashing.hashlib, "sha256", lambda *a: reads.append(1) or real(*a))
    path = tmp_path / "encoder.safetensors"
    path.write_bytes(b"a" * 1000)
    first = hashing.file_digest(path)
    assert first == real(b"a" * 1000).hexdigest()
    assert [hashing.file_digest(path) for _ in range(5)] == [first] * 5 and len(reads) == 1

    fresh = tmp_path / "new"
    fresh.write_bytes(b"b" * 1000)
    os.replace(fresh, path)  # written again atomically: a new inode
    assert hashing.file_digest(path) == real(b"b" * 1000).hexdigest() and len(reads) == 2

    before = path.stat().st_mtime_ns
    with open(path, "r+b") as f:  # modified in place, same size
        f.write(b"c")
    os.utime(path, ns=(before + 1, before + 1))  # even on a file system with coarse timestamps
    assert hashing.file_digest(path) == real(b"c" + b"b" * 999).hexdigest() and len(reads) == 3


def _packed(tmp_path, vocab_size=500):
    """A synthetic corpus tokenized, and packed: (its PretrainData, the pack's directory, the spec)."""
    from pretrainlab.data.packed import pack_corpus

    spec = TokenizerSpec(vocab_size=vocab_size)
    data = PretrainData(SyntheticCorpus(num_documents=80), spec, tmp_path / "cache", val_fraction=0.1)
    pack = pack_corpus(tmp_path / "pack", data.tokenized, data.tokenizer, spec, data.corpus.key(), "synthetic")
    return data, pack, spec


def test_a_packed_corpus_gives_the_runs_of_the_text_it_came_from(tmp_path):
    """The pack's documents, tokenizer, held-out split and examples are those of its source corpus."""
    from pretrainlab.data.packed import PackedCorpus

    data, pack, spec = _packed(tmp_path)
    packed = PretrainData(PackedCorpus(path=str(pack)), spec, tmp_path / "other-cache", val_fraction=0.1)
    for name in ("tokens", "sentence_offsets", "doc_offsets"):
        assert np.array_equal(getattr(packed.tokenized, name), getattr(data.tokenized, name)), name
    assert packed.tokenizer.to_str() == data.tokenizer.to_str()
    assert np.array_equal(packed.split_indices("val"), data.split_indices("val"))
    tokens = special_tokens(data.tokenizer)
    builder = PackedBlocks(64, tokens.cls_id, tokens.sep_id)
    a, b = data.examples(builder, "train"), packed.examples(builder, "train")
    assert len(a) == len(b) > 0 and all(np.array_equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(len(a)))
    assert np.load(pack / "tokens.npy").dtype == np.uint16  # a vocabulary below 65,536 is stored in two bytes
    assert "80 documents" in packed.corpus.describe()


def test_a_packed_corpus_refuses_another_tokenizer_and_a_damaged_pack(tmp_path):
    from pretrainlab.data.corpus import CorpusError
    from pretrainlab.data.packed import PackedCorpus

    _, pack, spec = _packed(tmp_path)
    other = PretrainData(PackedCorpus(path=str(pack)), TokenizerSpec(vocab_size=600), tmp_path / "c1")
    with pytest.raises(CorpusError, match="tokenizer.vocab_size=500.*asks for 600"):
        _ = other.tokenizer
    with pytest.raises(CorpusError, match="holds tokens, not text"):
        other.corpus.documents(tmp_path)
    tokens = pack / "tokens.npy"
    raw = bytearray(tokens.read_bytes())
    raw[-1] ^= 1
    tokens.write_bytes(bytes(raw))
    with pytest.raises(CorpusError, match="tokens.npy is not the file the pack was made with"):
        PretrainData(PackedCorpus(path=str(pack)), spec, tmp_path / "c2")
    with pytest.raises(CorpusError, match="not a packed corpus"):
        PretrainData(PackedCorpus(path=str(tmp_path)), spec, tmp_path / "c3")


def test_a_packed_corpus_needs_no_datasets_library(tmp_path):
    """A machine that has the packed corpus needs neither its text nor ``datasets`` (a GPU slot's node):
    the pack is read and its examples built and cached with pyarrow alone."""
    import subprocess
    import sys

    _, pack, _ = _packed(tmp_path)
    script = f"""
import sys
sys.modules["datasets"] = None  # importing it fails
from pretrainlab.data.packed import PackedCorpus
from pretrainlab.data.packing import PackedBlocks
from pretrainlab.data.pipeline import PretrainData
from pretrainlab.data.tokenizer import TokenizerSpec
from pretrainlab.tokens import special_tokens
data = PretrainData(PackedCorpus(path={str(pack)!r}), TokenizerSpec(vocab_size=500), {str(tmp_path / "fresh")!r})
t = special_tokens(data.tokenizer)
print(len(data.examples(PackedBlocks(64, t.cls_id, t.sep_id), "train")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and int(done.stdout.strip()) > 0, done.stderr[-2000:]
