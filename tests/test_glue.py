"""GLUE: metrics against scikit-learn / scipy, the local reader on files in the real layout, the
synthetic suite, encoding, and the suite + comparison end to end on a briefly pretrained encoder."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
import torch

from pretrainlab.data.synthetic import SyntheticLanguage
from pretrainlab.data.world import split_words
from pretrainlab.evaluation.glue import metrics
from pretrainlab.evaluation.glue.data import GlueDataError, encode, read_local, read_tsv
from pretrainlab.evaluation.glue.synthetic import SIZES, SyntheticGlue
from pretrainlab.evaluation.glue.tasks import TASKS, get_task


# --- metrics ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, 500)
    pred = np.where(rng.random(500) < 0.7, label, 1 - label)  # correlated predictions
    assert metrics.accuracy(pred, label) == pytest.approx(sklearn.metrics.accuracy_score(label, pred))
    assert metrics.f1(pred, label) == pytest.approx(sklearn.metrics.f1_score(label, pred))
    assert metrics.matthews_corrcoef(pred, label) == pytest.approx(sklearn.metrics.matthews_corrcoef(label, pred))
    three, gold = rng.integers(0, 3, 300), rng.integers(0, 3, 300)  # MNLI: three classes
    assert metrics.accuracy(three, gold) == pytest.approx(sklearn.metrics.accuracy_score(gold, three))


def test_metric_edge_cases_match_scikit_learn():
    label = np.array([1, 1, 0, 0])
    for pred in (np.zeros(4, int), np.ones(4, int)):  # a constant predictor: MCC 0, F1 as sklearn
        assert metrics.matthews_corrcoef(pred, label) == sklearn.metrics.matthews_corrcoef(label, pred) == 0.0
        assert metrics.f1(pred, label) == pytest.approx(sklearn.metrics.f1_score(label, pred, zero_division=0))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy_including_ties(seed):
    rng = np.random.default_rng(seed)
    x = np.round(rng.uniform(0, 5, 400), 1)  # many ties, like STS-B's scores
    y = np.round(x + rng.normal(0, 1.5, 400), 1)
    assert metrics.pearson(y, x) == pytest.approx(scipy.stats.pearsonr(y, x)[0], abs=1e-10)
    assert metrics.spearman(y, x) == pytest.approx(scipy.stats.spearmanr(y, x)[0], abs=1e-10)


# --- reading GLUE files ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    return SyntheticGlue(scale=0.2).write(tmp_path_factory.mktemp("glue"))


def test_synthetic_suite_is_written_in_the_real_glue_layout(suite_dir):
    cola_dev = (suite_dir / "CoLA" / "dev.tsv").read_bytes()
    assert not cola_dev.endswith(b"\n")  # like the real CoLA dev file
    assert cola_dev.split(b"\t")[1] in (b"0", b"1")  # no header
    assert (suite_dir / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")  # BOM
    assert len((suite_dir / "STS-B" / "dev.tsv").read_text().splitlines()[0].split("\t")) == 10
    assert {p.name for p in (suite_dir / "MNLI").iterdir()} == {"train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"}
    for name, spec in TASKS.items():
        splits = read_local(spec, suite_dir)
        n_train, n_dev = SIZES[name]
        assert len(splits["train"]) == max(8, round(0.2 * n_train))
        for split in spec.eval_splits:
            assert len(splits[split]) == max(8, round(0.2 * n_dev))
        labels = splits["train"].labels
        if spec.is_regression:
            assert labels.dtype == np.float32 and 0 <= labels.min() and labels.max() <= 5
        else:  # every class occurs, none dominates beyond 75%
            counts = np.bincount(labels, minlength=spec.num_labels)
            assert counts.min() > 0 and counts.max() / counts.sum() < 0.75, (name, counts)


def test_synthetic_suite_is_deterministic_and_cached(tmp_path):
    a = SyntheticGlue(scale=0.05).write(tmp_path / "a")
    b = SyntheticGlue(scale=0.05).write(tmp_path / "b")
    assert (a / "RTE" / "train.tsv").read_bytes() == (b / "RTE" / "train.tsv").read_bytes()
    stamp = (a / "suite.json").stat().st_mtime_ns
    assert SyntheticGlue(scale=0.05).write(tmp_path / "a") == a and (a / "suite.json").stat().st_mtime_ns == stamp
    c = SyntheticGlue(scale=0.05, seed=1).write(tmp_path / "a")
    assert c != a and (c / "RTE" / "train.tsv").read_bytes() != (a / "RTE" / "train.tsv").read_bytes()


def _padding(lengths: np.ndarray, order: list[int], batch_size: int) -> float:
    batches = [lengths[order[i : i + batch_size]] for i in range(0, len(order), batch_size)]
    return 1 - lengths.sum() / sum(b.max() * len(b) for b in batches)


def test_batches_are_padded_to_their_longest_and_rounded_only_when_asked():
    from pretrainlab.evaluation.glue.data import collate

    items = [(i, np.arange(1, n + 1), np.zeros(n, np.int64), i % 2) for i, n in enumerate([5, 11, 3])]
    batch = collate(items, pad_id=0)
    assert batch["input_ids"].shape == (3, 11)  # no column that is padding in every row
    assert batch["attention_mask"].sum(1).tolist() == [5, 11, 3] and batch["index"].tolist() == [0, 1, 2]
    assert (batch["input_ids"][0, 5:] == 0).all() and batch["input_ids"][1, -1] == 11
    assert collate(items, pad_id=0, multiple=8)["input_ids"].shape == (3, 16)  # compiled runs: fewer shapes


def test_length_grouped_batches_carry_little_padding_and_stay_random():
    from pretrainlab.evaluation.glue.data import LengthGroupedSampler

    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(2.5, 0.6, 5000).astype(int) + 3, 128)  # CoLA-like: mostly short
    sampler = LengthGroupedSampler(lengths, 32, torch.Generator().manual_seed(0))
    epochs = [list(sampler) for _ in range(3)]
    assert all(sorted(e) == list(range(5000)) for e in epochs)  # each example once per epoch
    assert epochs[0] != epochs[1]  # a new order every epoch...
    again = LengthGroupedSampler(lengths, 32, torch.Generator().manual_seed(0))
    assert list(again) == epochs[0]  # ...and the same orders from the same seed
    random_order = rng.permutation(5000).tolist()
    sorted_order = np.argsort(lengths, kind="stable").tolist()  # the least padding any order can give
    assert _padding(lengths, random_order, 32) > 0.5  # random batches: mostly padding
    assert _padding(lengths, epochs[0], 32) < 2.0 * _padding(lengths, sorted_order, 32) + 0.05 < 0.25
    # the batches come in random order, not from short to long
    batch_max = [lengths[epochs[0][i : i + 32]].max() for i in range(0, 5000, 32)]
    assert abs(np.corrcoef(np.arange(len(batch_max)), batch_max)[0, 1]) < 0.2
    # which examples share a batch changes between epochs
    first = {frozenset(epochs[0][i : i + 32]) for i in range(0, 5000, 32)}
    assert len(first & {frozenset(epochs[1][i : i + 32]) for i in range(0, 5000, 32)}) < 5


def _content_words(split) -> set[str]:
    """Every word of a split's texts that is a noun, verb or adjective of the language."""
    lex = SyntheticLanguage().build()
    content = {w for t in lex.topics for k in ("nouns", "verbs", "adjectives") for w in t[k]}
    texts = list(split.text_a) + list(split.text_b or [])
    return {w.strip(".?").lower() for text in texts for w in text.split()} & content


def test_unseen_words_keep_dev_vocabulary_out_of_training(tmp_path):
    root = SyntheticGlue(scale=0.3, unseen_words=0.5).write(tmp_path)
    held = split_words(SyntheticLanguage(), 0.5, 0)
    held_words = {w for t in held for ws in t.values() for w in ws}
    for name, spec in TASKS.items():
        splits = read_local(spec, root)
        train = _content_words(splits["train"])
        dev = set().union(*(_content_words(splits[s]) for s in spec.eval_splits))
        assert train and dev and not train & held_words and dev <= held_words, name
    assert SyntheticGlue(scale=0.3).write(tmp_path) != root  # a suite of its own in the cache
    with pytest.raises(ValueError, match="unseen_words=1.0"):
        SyntheticGlue(unseen_words=1.0)


def test_reader_keeps_quotes_and_maps_labels(tmp_path):
    d = tmp_path / "RTE"
    d.mkdir()
    (d / "train.tsv").write_text(
        'index\tsentence1\tsentence2\tlabel\n0\tHe said "no.\tNo "quote\tentailment\n1\ta\tb\tnot_entailment\n'
    )
    split = read_tsv(get_task("rte"), d / "train.tsv")
    assert split.text_a == ['He said "no.', "a"] and split.text_b == ['No "quote', "b"]
    assert split.labels.tolist() == [0, 1]


def test_reader_errors_name_the_problem(tmp_path):
    d = tmp_path / "RTE"
    d.mkdir()
    (d / "train.tsv").write_text("index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(GlueDataError, match="expected column 'sentence1'"):
        read_tsv(get_task("rte"), d / "train.tsv")
    (d / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(GlueDataError, match="label 'maybe' is not one of"):
        read_tsv(get_task("rte"), d / "train.tsv")
    with pytest.raises(FileNotFoundError, match="download_glue_data.py"):
        read_local(get_task("mrpc"), tmp_path)
    with pytest.raises(KeyError, match="unknown GLUE task 'glu'"):
        get_task("glu")


def test_an_evaluation_file_is_read_completely_or_not_at_all(suite_dir, tmp_path, caplog):
    import shutil

    copy = tmp_path / "glue"
    shutil.copytree(suite_dir / "RTE", copy / "RTE")
    dev = copy / "RTE" / "dev.tsv"
    lines = dev.read_text().splitlines()
    for i in range(1, len(lines), 3):  # a third of the rows lose their label column
        lines[i] = "\t".join(lines[i].split("\t")[:3])
    dev.write_text("\n".join(lines) + "\n")
    with pytest.raises(GlueDataError, match=f"{dev}, line 2: 3 column\\(s\\), RTE has 4"):
        read_local(get_task("rte"), copy)
    train = copy / "RTE" / "train.tsv"  # a training file keeps its parseable rows, with a warning
    rows = train.read_text().splitlines()
    train.write_text("\n".join(rows[:3] + ["7\tbroken"] + rows[3:]) + "\n")
    assert len(read_tsv(get_task("rte"), train)) == len(rows) - 1
    assert "skipped 1 line(s) without the file's 4 columns (lines 4)" in caplog.text


def test_a_tab_inside_a_sentence_never_shifts_the_columns(tmp_path, caplog):
    """An MRPC row with a tab inside a sentence has one column too many: reading it by position
    would give every later column the wrong text (and the label of a header-less file the wrong field)."""
    d = tmp_path / "MRPC"
    d.mkdir()
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    good = ["1\t1\t2\tThe cat sat.\tA cat sat.", "0\t3\t4\tIt rained.\tThe sun shone."]
    (d / "dev.tsv").write_text("\n".join([header, good[0], "1\t5\t6\tA tab\there.\tA tab here.", good[1]]) + "\n")
    with pytest.raises(GlueDataError, match=r"dev.tsv, line 3: 6 column\(s\), MRPC has 5 \(a tab inside a sentence"):
        read_tsv(get_task("mrpc"), d / "dev.tsv", complete=True)
    (d / "train.tsv").write_text("\n".join([header, good[0], "1\t5\t6\tA tab\there.\tA tab here.", good[1]]) + "\n")
    split = read_tsv(get_task("mrpc"), d / "train.tsv")
    assert split.text_a == ["The cat sat.", "It rained."] and split.text_b == ["A cat sat.", "The sun shone."]
    assert "skipped 1 line(s) without the file's 5 columns (lines 3)" in caplog.text
    cola = tmp_path / "CoLA"  # no header: four columns
    cola.mkdir()
    (cola / "dev.tsv").write_text("gj04\t1\t\tThe dog barked.\ngj04\t0\t*\tDog the\tbarked.\n")
    with pytest.raises(GlueDataError, match="line 2: 5 column"):
        read_tsv(get_task("cola"), cola / "dev.tsv", complete=True)


def _result(label, model, pretrain_seed, encoder, task, seed, value, examples=277):
    return {
        "task": task,
        "seed": seed,
        "label": label,
        "metrics": {"accuracy": value},
        "pretrained": {
            "encoder_id": encoder,
            "model": model,
            "pretrain_seed": pretrain_seed,
            "run_dir": f"runs/{encoder}",
        },
        "eval_examples": {"validation": examples},
        "run_dir": f"runs/{encoder}/glue/{task}/seed{seed}",
    }


def test_encoders_of_one_objective_are_told_apart_and_pretraining_seeds_aggregated():
    from pretrainlab.compare import CompareError, aggregate

    tiny = [_result("roberta", "tiny", 0, "t0", "rte", s, v) for s, v in [(0, 0.473), (1, 0.480)]]
    mini = [_result("roberta", "mini", 0, "m0", "rte", s, v) for s, v in [(0, 0.527), (1, 0.540)]]
    one, other = aggregate(tiny + mini), aggregate(mini + tiny)
    assert one == other and one["labels"] == ["roberta (mini)", "roberta (tiny)"]
    assert one["cells"]["roberta (tiny)"]["rte"]["score"][0] == pytest.approx(47.65)
    assert one["cells"]["roberta (mini)"]["rte"]["score"][0] == pytest.approx(53.35)

    # two pretraining seeds of one kind share a row; both spreads are reported
    seeds = [
        _result("bert", "tiny", p, f"b{p}", "rte", s, v)
        for p, vs in [(0, [0.50, 0.52, 0.54]), (1, [0.60, 0.62, 0.64])]
        for s, v in enumerate(vs)
    ]
    cell = aggregate(seeds)["cells"]["bert"]["rte"]
    assert cell["score"][0] == pytest.approx(57.0) and cell["encoders"] == 2
    assert cell["score"][1] == pytest.approx(2.0)  # within an encoder, over fine-tuning seeds
    assert cell["pretrain_sd"]["score"] == pytest.approx(np.std([52.0, 62.0], ddof=1))

    # one fine-tuning seed per encoder: no spread within an encoder (it once read "± 0.0"), the sd over
    # pretraining seeds and the interval over them
    from pretrainlab.compare.tables import to_markdown

    one_each = [_result("bert", "tiny", p, f"b{p}", "rte", 0, v) for p, v in [(0, 0.50), (1, 0.60), (2, 0.55)]]
    md = to_markdown(aggregate(one_each))
    (row,) = [line for line in md.splitlines() if line.startswith("| bert |")]
    assert "±" not in row and row.split("|")[2].strip().startswith(f"55.0 [{np.std([50, 60, 55], ddof=1):.1f}] (")
    assert "3 pretraining seed(s) per row, one fine-tuning seed each" in md and "pooled within" not in md
    assert "±" in to_markdown(aggregate(seeds))  # several fine-tuning seeds: the spread within an encoder

    clash = [_result("roberta", "tiny", 0, "t1", "rte", 0, 0.9)]  # another encoder, same name and seed
    with pytest.raises(CompareError, match="two different encoders are both 'roberta', pretraining seed 0"):
        aggregate(tiny + clash)
    fewer = [_result("roberta", "mini", 0, "m0", "rte", 2, 0.6, examples=185)]
    with pytest.raises(CompareError, match="rte results were evaluated on different numbers of examples"):
        aggregate(tiny + mini + fewer)


def test_compare_cli_names_apart_two_runs_that_claim_one_row(tmp_path):
    import sys

    from tests.conftest import ROOT, run_command

    for name, encoder, value in (("a", "e1", 0.5), ("b", "e2", 0.7)):
        d = tmp_path / name / "glue" / "rte"
        d.mkdir(parents=True)
        (d / "seed0.json").write_text(json.dumps(_result("roberta", "tiny", 0, encoder, "rte", 0, value)))
    cmd = [
        sys.executable,
        "experiments/compare.py",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        "--wandb",
        "disabled",
        "--out",
        str(tmp_path / "cmp"),
    ]
    refused = run_command(cmd, cwd=ROOT)
    assert refused.returncode == 2 and "--label" in refused.stderr and not (tmp_path / "cmp").exists()
    named = run_command(cmd + ["--label", f"{tmp_path / 'b'}=roberta-long"], cwd=ROOT)
    assert named.returncode == 0, named.stderr
    assert "| roberta |" in named.stdout and "| roberta-long |" in named.stdout


def test_dev_batches_come_in_order_of_length_and_hold_every_example_once():
    from pretrainlab.evaluation.glue.data import EncodedSplit, eval_loader

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 120, 300)  # CoLA-like: mostly short, some long
    split = EncodedSplit(
        [np.full(n, 7) for n in lengths], [np.zeros(n, np.int64) for n in lengths], np.zeros(300, np.int64), 0
    )
    batches = list(eval_loader(split, 32, pad_id=0))
    seen = np.concatenate([b["index"].numpy() for b in batches])
    assert sorted(seen) == list(range(300))
    padded = sum(b["input_ids"].numel() for b in batches)
    in_order = sum(-(-max(lengths[i : i + 32]) // 8) * 8 * len(lengths[i : i + 32]) for i in range(0, 300, 32))
    assert padded < 0.7 * in_order  # far less padding than batches in file order
    assert all(torch.equal(b["input_ids"] != 0, b["attention_mask"]) for b in batches)


def test_encoding_pairs_segments_and_longest_first_truncation():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghij"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    from pretrainlab.evaluation.glue.data import GlueSplit
    from pretrainlab.tokens import special_tokens

    tokens = special_tokens(tok)
    split = GlueSplit(["a b c d e f g", "a"], ["h i", "b c"], np.array([0, 1]))
    enc = encode(split, tok, tokens, max_seq_len=8)
    first, second = enc.ids[0].tolist(), enc.ids[1].tolist()
    # budget 5 for A + B: A (7) is cut before B (2) until A's length reaches B's
    assert first == [2, vocab["a"], vocab["b"], vocab["c"], 3, vocab["h"], vocab["i"], 3]
    assert enc.types[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert second == [2, vocab["a"], 3, vocab["b"], vocab["c"], 3] and enc.truncated == 1
    single = encode(GlueSplit(["a b c d e f g h i j"], None, np.array([1])), tok, tokens, max_seq_len=6)
    assert single.ids[0].tolist() == [2, vocab["a"], vocab["b"], vocab["c"], vocab["d"], 3]
    assert single.types[0].tolist() == [0] * 6


# --- end to end: pretrain briefly, fine-tune pretrained and scratch, compare ----------------------
FAST = [
    "glue.source=synthetic",
    "glue.synthetic.scale=0.25",
    "logger=csv",
    "trainer.enable_progress_bar=false",
    "task_overrides.lr=3.0e-4",
    "task_overrides.epochs=2",
    "task_overrides.batch_size=32",
    "task_overrides.max_seq_len=64",
]


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    from pretrainlab.pretraining.run import run
    from tests.conftest import SMALL, compose_train

    out = tmp_path_factory.mktemp("pretrain")
    result = run(compose_train(*SMALL, "data.num_documents=600", "max_steps=60", "val_every=60"), out)
    return result["run_dir"]


def test_suite_and_comparison_end_to_end(pretrained_run, tmp_path, monkeypatch):
    from pretrainlab.compare import collect, write_report
    from pretrainlab.studies import suite
    from tests.conftest import compose_config

    tasks, seeds = ["cola", "mrpc", "stsb", "mnli"], [0, 1]
    for init in ("pretrained", "scratch"):
        cfg = compose_config("suite", f"pretrained={pretrained_run}", f"init={init}", *FAST)
        results = suite.run_suite(cfg, tasks, seeds, None, dict(cfg.task_overrides))
        assert len(results) == len(tasks) * len(seeds)
    out = os.path.join(pretrained_run, "glue")
    one = json.loads(open(os.path.join(out, "mnli", "seed1.json")).read())
    assert one["label"] == "roberta" and one["seed"] == 1 and one["pretrained"]["objective"] == "roberta"
    assert set(one["metrics"]) == {"accuracy_m", "accuracy_mm"}
    assert one["metrics"] == one["history"][-1]["metrics"] and len(one["history"]) == 2  # the last epoch
    assert one["config"]["task"]["lr"] == 3.0e-4 and one["train_examples"] == 750
    scratch = json.loads(open(os.path.join(pretrained_run, "glue-scratch", "mnli", "seed1.json")).read())
    assert scratch["label"] == "scratch"
    assert open(os.path.join(out, "summary.md")).read().count("|") > 10

    # re-running the suite redoes nothing
    def fail(*a, **k):
        raise AssertionError("a finished (task, seed) was run again")

    monkeypatch.setattr("pretrainlab.evaluation.run.run", fail)
    cfg = compose_config("suite", f"pretrained={pretrained_run}", *FAST)
    assert len(suite.run_suite(cfg, tasks, seeds, None, dict(cfg.task_overrides))) == 8
    # the same encoder named by its export directory is the same; results of another are not mixed in
    same = compose_config("suite", f"pretrained={pretrained_run}/encoder", *FAST)
    assert len(suite.run_suite(same, tasks, seeds, out, dict(cfg.task_overrides))) == 8
    other = compose_config("suite", f"pretrained={pretrained_run}", "init=scratch", *FAST)
    with pytest.raises(ValueError, match="Use another output_dir"):
        suite.run_suite(other, tasks, seeds, out, dict(cfg.task_overrides))
    # nor results fine-tuned with other settings: another recipe, other data
    for change in ("task_overrides.lr=1.0e-3", "glue.synthetic.unseen_words=0.5", "glue.group_by_length=true"):
        other = compose_config("suite", f"pretrained={pretrained_run}", *FAST, change)
        with pytest.raises(
            ValueError,
            match=r"other settings \((task.lr|glue.synthetic.unseen_words|"
            r"glue.group_by_length): .* then",
        ):
            suite.run_suite(other, tasks, seeds, out, dict(other.task_overrides))
    # results written before a setting existed count as made with its old behaviour
    path = os.path.join(out, "cola", "seed0.json")
    done = json.loads(open(path).read())
    del done["config"]["glue"]["synthetic"]["unseen_words"]  # 0.0 before the setting: the same suite
    del done["config"]["glue"]["group_by_length"]  # random batches before the setting
    open(path, "w").write(json.dumps(done))
    assert len(suite.run_suite(cfg, tasks, seeds, None, dict(cfg.task_overrides))) == 8
    grouped = compose_config("suite", f"pretrained={pretrained_run}", *FAST, "glue.group_by_length=true")
    with pytest.raises(ValueError, match=r"glue.group_by_length: False then, True now"):
        suite.run_suite(grouped, tasks, seeds, None, dict(grouped.task_overrides))

    table = write_report(collect([pretrained_run]), tmp_path / "cmp")
    assert table["labels"] == ["roberta", "scratch"] and table["tasks"] == ["cola", "mrpc", "stsb", "mnli"]
    assert table["glue_tasks"] == tasks
    for label in table["labels"]:
        runs = [
            json.loads(
                open(
                    os.path.join(
                        pretrained_run, "glue" if label != "scratch" else "glue-scratch", "mrpc", f"seed{s}.json"
                    )
                ).read()
            )
            for s in seeds
        ]
        f1 = [100 * r["metrics"]["f1"] for r in runs]
        assert table["cells"][label]["mrpc"]["metrics"]["f1"] == pytest.approx((np.mean(f1), np.std(f1, ddof=1)))
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "| roberta |" in md and "| scratch |" in md and "WNLI excluded" in md
    assert (tmp_path / "cmp" / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert "mrpc,f1" in (tmp_path / "cmp" / "comparison.csv").read_text().replace("roberta,", "")


def test_results_of_an_encoder_that_was_replaced_are_not_reported_as_the_new_ones(tmp_path, monkeypatch):
    """Finished results are keyed by the hash of the encoder's weights, not by its directory."""
    import shutil

    from pretrainlab.pretraining.run import run
    from pretrainlab.studies import suite
    from tests.conftest import SMALL, compose_config, compose_train

    quick = [*SMALL, "max_steps=3", "val_every=3", "checkpoint_every=3"]
    run(compose_train(*quick), tmp_path / "run")
    run(compose_train(*quick, "seed=1"), tmp_path / "other")
    cfg = compose_config("suite", f"pretrained={tmp_path / 'run'}", *FAST, "glue.synthetic.scale=0.05")
    first = suite.run_suite(cfg, ["rte"], [0], None, dict(cfg.task_overrides))
    assert first[0]["pretrained"]["encoder_id"] == first[0]["pretrained"]["weights_sha256"]
    shutil.rmtree(tmp_path / "run" / "encoder")  # the directory now holds another encoder
    shutil.copytree(tmp_path / "other" / "encoder", tmp_path / "run" / "encoder")
    monkeypatch.setattr("pretrainlab.evaluation.run.run", lambda *a, **k: pytest.fail("ran instead of refusing"))
    with pytest.raises(ValueError, match="holds results of another encoder"):
        suite.run_suite(cfg, ["rte"], [0], None, dict(cfg.task_overrides))


def test_finetune_cli_and_compare_cli_offline(pretrained_run, tmp_path):
    import sys

    from tests.conftest import ROOT, run_command

    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [
        sys.executable,
        "finetune.py",
        f"pretrained={pretrained_run}",
        "task=rte",
        "glue.source=synthetic",
        "glue.synthetic.scale=0.1",
        "task.epochs=1",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}/ft",
    ]
    done = run_command(cmd, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "ft" / "results.json").read_text())
    assert result["task"] == "rte" and 0 <= result["metrics"]["accuracy"] <= 1
    runs = list((tmp_path / "ft" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1  # fine-tuning logs to W&B offline by default
    cmd = [sys.executable, "experiments/compare.py", str(tmp_path / "ft"), "--out", str(tmp_path / "cmp")]
    done = run_command(cmd, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "| roberta |" in out and (tmp_path / "cmp" / "comparison.png").is_file()
    assert list((tmp_path / "cmp" / "wandb").glob("offline-run-*"))


def test_an_unreachable_hub_fails_at_once_with_the_offline_advice(monkeypatch):
    """No minute of retries when the hub does not answer: the datasets cache alone is tried."""
    import time

    import datasets.config
    import huggingface_hub.constants

    from pretrainlab.evaluation.glue import data
    from pretrainlab.evaluation.glue.tasks import get_task

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # restored after the test, whatever read_hub sets
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", datasets.config.HF_DATASETS_OFFLINE)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", huggingface_hub.constants.HF_HUB_OFFLINE)
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=3.0: False)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="glue.data_dir"):
        data.read_hub(get_task("rte"), "pretrainlab-test/no-such-glue")
    assert time.monotonic() - start < 10


def test_snapshot_results_make_a_curve_with_intervals_and_a_wandb_chart(tmp_path):
    """Results of snapshots stay out of the table and make the GLUE-against-FLOPs curve: one point per
    fraction, its FLOPs the encoders' mean, its interval over the seeds; logged to W&B as a table."""
    import wandb  # noqa: F401

    from pretrainlab.compare import curve, write_report
    from pretrainlab.runtime.wandb_runs import log_comparison

    def at(label, fraction, flops, values):
        out = []
        for seed, v in enumerate(values):
            r = _result(label, "tiny", 0, f"{label}-{fraction}", "rte", seed, v)
            r["pretrained"].update(fraction=fraction, pretrain_flops=flops)
            out.append(r)
        return out

    results = (
        at("roberta", 0.5, 1e12, [0.50, 0.52, 0.51])
        + at("roberta", 1.0, 2e12, [0.60, 0.63, 0.61])
        + at("electra", 0.5, 1.1e12, [0.55, 0.56, 0.58])
        + at("electra", 1.0, 2.1e12, [0.66, 0.64, 0.65])
    )
    table = write_report(results, tmp_path / "cmp", baseline="roberta")
    # the table holds the final encoders only: three seeds each, not six
    assert table["cells"]["roberta"]["rte"]["score"][0] == pytest.approx(100 * np.mean([0.60, 0.63, 0.61]))
    assert len(table["cells"]["roberta"]["rte"]["seeds"]) == 3
    lines = curve(results)
    assert lines == table["curve"]
    assert [p["fraction"] for p in lines["electra"]] == [0.5, 1.0]
    assert [p["flops"] for p in lines["electra"]] == [1.1e12, 2.1e12]
    first = lines["roberta"][0]
    assert first["glue"] == pytest.approx(51.0) and first["ci"][0] < 51.0 < first["ci"][1]
    for name in ("curve.png", "curve.csv"):
        assert (tmp_path / "cmp" / name).stat().st_size > 100
    run_dir = log_comparison(table, tmp_path / "cmp", mode="offline", group="curve-test")
    chart = list(Path(run_dir).glob("media/table/glue/curve_table_*.table.json"))  # the line chart's data
    assert chart and len(json.loads(chart[0].read_text())["data"]) == 4
    tables = list(Path(run_dir).glob("media/table/glue/curve_points_*.table.json"))
    assert tables, list(Path(run_dir).rglob("*"))
    logged = json.loads(tables[0].read_text())
    rows = [dict(zip(logged["columns"], r)) for r in logged["data"]]
    assert sorted((r["encoder"], r["fraction"]) for r in rows) == [
        ("electra", 0.5),
        ("electra", 1.0),
        ("roberta", 0.5),
        ("roberta", 1.0),
    ]


@pytest.mark.slow
def test_the_transformers_reference_fine_tunes_what_pretrainlab_fine_tunes(pretrained_run, tmp_path):
    """experiments/glue_reference.py: transformers' sequence classifier on the exported encoder, trained
    on the same examples with the same settings, learns synthetic SST-2 as pretrainlab's run does (both
    far above the majority class of its dev set), and its regression path (STS-B) gives the metrics
    pretrainlab's results give."""
    import csv
    import sys

    from tests.conftest import ROOT, run_command

    settings = ["glue.source=synthetic", "glue.synthetic.scale=0.5", "task.lr=1.0e-3", "task.batch_size=32"]
    settings += ["task.max_seq_len=64", "trainer.enable_progress_bar=false"]
    rows = {}
    for task, epochs in (("sst2", 5), ("stsb", 1)):
        out = tmp_path / task
        done = run_command(
            [sys.executable, str(ROOT / "experiments" / "glue_reference.py"), pretrained_run, f"task={task}"]
            + [*settings, f"task.epochs={epochs}", "--out", str(out)]
        )
        assert done.returncode == 0, done.stderr[-3000:]
        rows[task] = {r["side"]: r for r in csv.DictReader((out / "results.csv").open())}
        assert set(rows[task]) == {"pretrainlab", "transformers"}
        assert (out / "hf" / "config.json").is_file() and (out / "pretrainlab-seed0" / "results.json").is_file()
    majority = json.loads((tmp_path / "sst2" / "pretrainlab-seed0" / "results.json").read_text())["no_skill"][
        "accuracy"
    ]
    for side in ("pretrainlab", "transformers"):
        assert float(rows["sst2"][side]["accuracy"]) >= majority + 0.3, (side, majority, rows["sst2"])
        assert {k for k in rows["stsb"][side] if k not in ("side", "seed")} == {"pearson", "spearman", "score"}
        assert np.isfinite([float(rows["stsb"][side][k]) for k in ("pearson", "spearman")]).all()


def test_the_reference_draws_a_loaded_pooler_afresh(tmp_path):
    """glue_reference.py --reinit-pooler: the pooler a checkpoint gave the model is drawn again as
    transformers initialises a linear layer (normal with the config's range, zero bias), for BERT's pooler
    (dense + tanh) and ALBERT's (a linear layer); a model without one is refused, naming it."""
    import transformers

    from pretrainlab.tools.glue_reference import reinitialise_pooler

    small = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128, vocab_size=100)
    for name in ("Bert", "Albert"):
        config = getattr(transformers, f"{name}Config")(initializer_range=0.5, **small)
        cls = getattr(transformers, f"{name}ForSequenceClassification")
        built = cls(config)
        with torch.no_grad():  # a checkpoint whose pooler is unlike a fresh draw
            for m in built.base_model.pooler.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.fill_(0.01)
                    m.bias.fill_(0.3)
        built.save_pretrained(tmp_path / name)
        hf = cls.from_pretrained(tmp_path / name)  # loaded, as the script loads it
        pooler = [m for m in hf.base_model.pooler.modules() if isinstance(m, torch.nn.Linear)]
        assert len(pooler) == 1 and float(pooler[0].bias.detach()[0]) == pytest.approx(0.3)
        reinitialise_pooler(hf)
        assert float(pooler[0].weight.detach().std()) == pytest.approx(0.5, rel=0.05)
        assert abs(float(pooler[0].weight.detach().mean())) < 0.05 and not pooler[0].bias.detach().any()
    electra = transformers.ElectraForSequenceClassification(transformers.ElectraConfig(embedding_size=64, **small))
    with pytest.raises(SystemExit, match="the electra export in x has no pooler"):
        reinitialise_pooler(electra, "the electra export in x")


def test_intervals_lie_inside_their_metrics_range_and_the_table_says_they_were_cut():
    """Three seeds that disagree about an accuracy near 100 gave a t interval of (77.0, 114.3) in the
    README; an MCC may go below 0, an accuracy not."""
    from pretrainlab.compare import aggregate
    from pretrainlab.compare.tables import to_markdown

    results = [_result("bert", "tiny", 0, "b0", "sst2", s, v) for s, v in enumerate([1.0, 0.98, 0.85])]
    results += [_result("bert", "tiny", 0, "b0", "rte", s, v) for s, v in enumerate([0.50, 0.55, 0.60])]
    cola = [_result("bert", "tiny", 0, "b0", "cola", s, v) for s, v in enumerate([0.4, -0.2, 0.1])]
    for r in cola:
        r["metrics"] = {"mcc": r["metrics"].pop("accuracy")}
    table = aggregate(results + cola)
    sst2 = table["cells"]["bert"]["sst2"]["summary"]["ci"]
    assert sst2[1] == 100.0 and 0.0 <= sst2[0] < 94.3  # the mean
    assert table["cells"]["bert"]["cola"]["summary"]["ci"][0] < 0.0  # MCC's range starts at -100
    glue = table["glue"]["bert"]["summary"]["ci"]
    assert -100.0 / 3 <= glue[0] and glue[1] <= 100.0
    text = to_markdown(table)
    assert "(" in text and ", 100.0)" in text and "Intervals are cut at the ends of their metric's range" in text
    numbers = [float(x) for x in __import__("re").findall(r"\((-?[\d.]+), (-?[\d.]+)\)", text)[0]]
    assert all(-100.0 <= x <= 100.0 for x in numbers)
    # a rendering shows the interval as the comparison computed it: one stored past the range (a report of
    # older code) is shown as it is, so that the README and the report it cites say the same
    table["cells"]["bert"]["sst2"]["summary"]["ci"] = [80.0, 114.3]
    assert "(80.0, 114.3)" in to_markdown(table)
    inside = aggregate([_result("bert", "tiny", 0, "b0", "rte", s, v) for s, v in enumerate([0.50, 0.55, 0.60])])
    assert "Intervals are cut" not in to_markdown(inside)
