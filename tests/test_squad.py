"""SQuAD (extractive question answering), added as an evaluation plugin: its metric against SQuAD
v1.1's definition, its windows and answers, its data checks, and a span head that learns."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from pretrainlab.evaluation import squad
from pretrainlab.tokens import SpecialTokens

# (prediction, gold answers, exact match, F1), worked out by hand from SQuAD v1.1's definition: lower case,
# ASCII punctuation removed, the articles a/an/the removed, whitespace collapsed; the best over the answers
CASES = [
    ("Denver Broncos", ["Denver Broncos"], 1.0, 1.0),
    ("The Denver Broncos!", ["Denver Broncos"], 1.0, 1.0),  # article and punctuation
    ("Broncos of Denver", ["Denver Broncos"], 0.0, 0.8),  # 2 shared tokens: precision 2/3, recall 1
    ("an apple", ["apple", "a pear"], 1.0, 1.0),  # the best of several answers
    ("a pear and an apple", ["apple", "pear"], 0.0, 0.5),  # "pear and apple": precision 1/3, recall 1
    ("theatre", ["the atre"], 0.0, 0.0),  # "the" inside a word is no article; "atre" alone shares nothing
    ("A.B.C.", ["abc"], 1.0, 1.0),  # punctuation inside a token
    ("Café–Bar", ["café bar"], 0.0, 0.0),  # an en dash is not ASCII punctuation: one token against two
    ("Café—Bar", ["Café—Bar", "bar"], 1.0, 1.0),
    ("  many   spaces ", ["Many spaces"], 1.0, 1.0),
    ("", ["anything"], 0.0, 0.0),
    ("the", ["a"], 1.0, 0.0),  # both normalise to nothing: equal, yet no shared token
    ("1,000 km", ["1000 km"], 1.0, 1.0),
    ("über straße", ["Über Straße"], 1.0, 1.0),  # unicode lower-cased
]


@pytest.mark.parametrize("prediction, golds, em, f1", CASES)
def test_the_metric_is_squad_v1_1s(prediction, golds, em, f1):
    examples = [squad.Example("q", "?", "context", tuple((g, 0) for g in golds))]
    got = squad.scores({"q": prediction}, examples)
    assert got == pytest.approx({"exact_match": em, "f1": f1})


def test_the_score_is_the_mean_over_questions_and_a_missing_prediction_scores_zero():
    examples = [squad.Example(str(i), "?", "c", (("yes", 0),)) for i in range(4)]
    got = squad.scores({"0": "yes", "1": "yes", "2": "no"}, examples)
    assert got == pytest.approx({"exact_match": 0.5, "f1": 0.5})


def _word_tokenizer(words: list[str]) -> tuple[Tokenizer, SpecialTokens]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(words)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok, SpecialTokens(len(vocab), 0, 1, 2, 3, 4, np.zeros(len(vocab), dtype=bool))


def test_long_contexts_are_cut_into_overlapping_windows_that_find_the_answer_through_offsets():
    words = [f"w{i}" for i in range(60)]
    context = " ".join(words)
    answer = "w41 w42 w43"
    start = context.index(answer)
    tok, tokens = _word_tokenizer([*words, "where", "?"])
    e = squad.Example("q", "where ?", context, ((answer, start),))
    w = squad.windows([e], tok, tokens, max_seq_len=24, doc_stride=8, max_query_length=64)
    room = 24 - 2 - 3  # [CLS] where ? [SEP] ... [SEP]
    assert all(len(ids) <= 24 for ids in w.ids) and len(w) == 1 + -(-(60 - room) // (room - 8))
    covered = []
    for k in range(len(w)):
        context_tokens = [tok.id_to_token(int(i)) for i, (s, _) in zip(w.ids[k], w.offsets[k]) if s >= 0]
        covered.append(context_tokens)
        if k:  # consecutive windows share doc_stride tokens
            assert covered[k - 1][-8:] == context_tokens[:8]
        if w.start[k]:  # a window holding the whole answer points at it; its characters are the answer's
            s, e_ = w.offsets[k][w.start[k]][0], w.offsets[k][w.end[k]][1]
            assert context[s:e_] == answer
        else:
            assert w.end[k] == 0 and not (context.index(covered[k][0]) <= start and answer.split()[-1] in covered[k])
    assert sorted({t for ts in covered for t in ts}, key=lambda t: int(t[1:])) == words
    assert sum(1 for k in range(len(w)) if w.start[k]) >= 1

    # the best span over the windows: the logits that point at the answer win
    starts = {k: np.zeros(len(w.ids[k])) for k in range(len(w))}
    ends = {k: np.zeros(len(w.ids[k])) for k in range(len(w))}
    k = next(k for k in range(len(w)) if w.start[k])
    starts[k][w.start[k]] = ends[k][w.end[k]] = 5.0
    assert squad.best_answers([e], w, starts, ends, n_best=5, max_answer_length=30) == {"q": answer}
    assert squad.best_answers([e], w, starts, ends, n_best=5, max_answer_length=2) != {"q": answer}  # too long


def test_files_that_are_not_squad_or_whose_answers_are_elsewhere_are_refused(tmp_path):
    good = {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "Paris is big.",
                        "qas": [
                            {"id": "1", "question": "What is big?", "answers": [{"text": "Paris", "answer_start": 0}]}
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(good))
    assert squad.read_file(path)[0].answers == (("Paris", 0),)
    good["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 3
    path.write_text(json.dumps(good))
    with pytest.raises(squad.SquadDataError, match="question 1: the answer 'Paris' is not at character 3"):
        squad.read_file(path)
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t"}]}))
    with pytest.raises(squad.SquadDataError, match="is not in SQuAD's format"):
        squad.read_file(path)
    path.write_text("{")
    with pytest.raises(squad.SquadDataError, match="cannot be read as SQuAD's JSON"):
        squad.read_file(path)
    (tmp_path / "train-a.json").write_text("{}")
    (tmp_path / "train-b.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="2 files match train"):
        squad.split_files(tmp_path)


def _document(*paragraphs):
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": list(paragraphs)}]}


def _qa(qid, text, start):
    return {"id": qid, "question": "What?", "answers": [{"text": text, "answer_start": start}]}


@pytest.mark.parametrize(
    "paragraphs, says",
    [
        # an empty context with empty answers: every empty prediction was an exact match (EM 1.0)
        ([{"context": "", "qas": [_qa("q1", "", 0)]}], "question q1 has an empty context"),
        ([{"context": "Paris is big.", "qas": [_qa("q2", " ", 5)]}], "question q2 has an empty answer"),
        # a negative start matched through Python's slicing ("big" is at -4 to -1), and lost its window
        (
            [{"context": "Paris is big.", "qas": [_qa("q3", "big", -4)]}],
            "question q3: the answer 'big' is not at character -4",
        ),
        # two questions of one id: predictions.json kept one answer for both
        (
            [
                {"context": "Paris is big.", "qas": [_qa("q4", "Paris", 0)]},
                {"context": "Rome is old.", "qas": [_qa("q4", "Rome", 0)]},
            ],
            "question id 'q4' appears twice",
        ),
        ([{"context": "Paris is big.", "qas": [{"id": "q5", "question": "?", "answers": []}]}], "q5 has no answer"),
        # an empty question was scored as one the model could answer
        ([{"context": "Paris is big.", "qas": [{**_qa("q6", "Paris", 0), "question": "  "}]}], "question q6 is empty"),
        # a boolean was read as character 1 (Python's int(True))
        ([{"context": "Paris is big.", "qas": [_qa("q7", "aris", True)]}], "question q7: answer_start True is not"),
        ([{"context": "Paris is big.", "qas": [_qa("q8", "aris", 1.5)]}], "question q8: answer_start 1.5 is not"),
    ],
)
def test_questions_that_are_not_real_questions_are_refused_naming_the_file_and_the_question(tmp_path, paragraphs, says):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(_document(*paragraphs)))
    with pytest.raises(squad.SquadDataError, match="dev-v1.1.json") as e:
        squad.read_file(path)
    assert says in str(e.value)


def test_the_synthetic_questions_have_one_answer_each_where_it_says(tmp_path):
    root = squad.SyntheticSquad(scale=0.1).write(tmp_path)
    for split in ("train", "validation"):
        examples = squad.read_file(squad.split_files(root)[split])  # every answer checked at its offset
        assert len(examples) == (200 if split == "train" else 40)
        assert all(len(e.answers) == 1 and e.answers[0][0] for e in examples)
        kinds = {e.question.split()[0] for e in examples}
        assert kinds == {"What", "Who"}
    again = squad.SyntheticSquad(scale=0.1).write(tmp_path / "again")
    assert (again / "dev-v1.1.json").read_text() == (root / "dev-v1.1.json").read_text()


QUESTIONS = [
    "squad.source=synthetic",
    "task.max_seq_len=96",
    "task.doc_stride=24",
    "task.lr=1.0e-3",
    "logger=csv",
    "trainer.enable_progress_bar=false",
]


@pytest.fixture
def pretrained(shared_run):
    """A tiny RoBERTa encoder as the learning tests pretrain it (300 steps on the synthetic corpus), made
    once per session and read-only."""
    from tests.test_learning import train

    return train(shared_run, "roberta", 300)[0]


@pytest.mark.slow
def test_the_span_head_learns_to_answer_and_writes_the_official_predictions(pretrained, tmp_path):
    """A tiny encoder pretrained on the synthetic corpus, fine-tuned on the synthetic questions: far above
    the trivial baseline (an answer that is never right scores 0), predictions.json in SQuAD's format
    with an answer for every dev question, scored as the run reports."""
    from pretrainlab.evaluation.run import run as finetune
    from tests.conftest import compose_config

    cfg = compose_config(
        "finetune", f"pretrained={pretrained}", "task=squad", "squad.synthetic.scale=0.5", "task.epochs=3", *QUESTIONS
    )
    result = finetune(cfg, tmp_path / "squad")
    assert result["task"] == "squad" and result["metrics"]["f1"] > 0.4 and result["metrics"]["exact_match"] > 0.15
    assert result["no_skill"] == {"exact_match": 0.0, "f1": 0.0}
    predictions = json.loads((tmp_path / "squad" / "predictions.json").read_text())
    dev = squad.read_file(squad.split_files(squad.SyntheticSquad(scale=0.5).write(cfg.cache_dir))["validation"])
    assert sorted(predictions) == sorted(e.id for e in dev) and all(isinstance(v, str) for v in predictions.values())
    assert squad.scores(predictions, dev) == pytest.approx(result["metrics"])


@pytest.mark.slow
def test_squad_is_a_column_of_a_studys_comparison_with_its_baseline(tmp_path):
    """``evals: [squad]`` in a study: every encoder (and scratch) fine-tuned on the questions, SQuAD in the
    report's table with its metrics and its difference against the baseline row; nothing else of the
    study knows what SQuAD is."""
    from pretrainlab.studies.ablation import run_study
    from tests.conftest import SMALL, compose_config

    pretrain = [*SMALL, "data.num_documents=200", "max_steps=150", "checkpoint_every=1000", "val_every=1000"]
    glue = [
        "squad.source=synthetic",
        "squad.synthetic.scale=0.2",
        "task_overrides.epochs=2",
        "task_overrides.lr=1.0e-3",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    table = run_study(
        compose_config(
            "ablate",
            "study=qa",
            f"output_root={tmp_path}",
            "objectives=[roberta]",
            "seeds=[0]",
            f"pretrain={quoted(pretrain)}",
            "evals=[squad]",
            "suite.seeds=[0,1]",
            "baseline=scratch",
            "intrinsic=false",
            f"suite.overrides={quoted(glue)}",
        )
    )
    assert table["tasks"] == ["squad"] and table["labels"] == ["roberta", "scratch"]
    assert set(table["cells"]["roberta"]["squad"]["metrics"]) == {"exact_match", "f1"}
    assert "squad" in table["differences"]["roberta"]
    md = (tmp_path / "qa" / "report" / "comparison.md").read_text()
    assert "| encoder | SQuAD (EM/F1) |" in md
    run = tmp_path / "qa" / "pretrain" / "roberta-s0"
    for seed in (0, 1):
        assert (run / "eval" / "squad" / f"seed{seed}.json").is_file()
        assert json.loads((run / "eval" / "squad" / f"seed{seed}" / "predictions.json").read_text())


@pytest.mark.slow
def test_transformers_question_answering_recipe_learns_the_questions_as_ours_does(pretrained, tmp_path):
    """experiments/squad_reference.py: the same exported encoder fine-tuned by transformers' recipe
    (its tokenizer's own windows, AutoModelForQuestionAnswering, its post-processing) on the same
    questions and settings; both sides far above the trivial baseline and close to each other."""
    import csv

    from pretrainlab.tools.squad_reference import main

    out = tmp_path / "reference"
    overrides = ["squad.synthetic.scale=0.5", "task.epochs=3", *QUESTIONS[:-2], "trainer.enable_progress_bar=false"]
    assert main([str(pretrained), *overrides, "--seeds", "0", "--out", str(out)]) == 0
    rows = {r["side"]: r for r in csv.DictReader(open(out / "results.csv"))}
    ours, theirs = float(rows["pretrainlab"]["f1"]), float(rows["transformers"]["f1"])
    assert ours > 40 and theirs > 40 and abs(ours - theirs) < 15, rows
    predictions = json.loads((out / "transformers-seed0" / "predictions.json").read_text())
    assert len(predictions) == 200 and all(isinstance(v, str) for v in predictions.values())
    # the report the docs cite: both sides' table, with the command, commit and device that made it
    report = json.loads((out / "report" / "report.json").read_text())
    assert [r[0] for r in report["rows"]] == ["`finetune.py task=squad`", "transformers' `run_qa` recipe"]
    assert report["rows"][0][3] == f"{ours:.2f}" and "200 dev questions" in report["about"]
    assert json.loads((out / "report" / "provenance.json").read_text())["command"].startswith("python ")


def test_the_reference_reports_each_sides_mean_over_seeds_and_the_gap_between_them():
    from pretrainlab.tools.squad_reference import summary

    rows = [
        {"side": side, "seed": seed, "exact_match": em, "f1": f1, "seconds": 10}
        for side, seed, em, f1 in [
            ("pretrainlab", 0, 3.0, 7.0),
            ("transformers", 0, 4.0, 9.0),
            ("pretrainlab", 1, 5.0, 9.0),
            ("transformers", 1, 4.0, 8.0),
        ]
    ]
    means, gap = summary(rows)
    assert means["pretrainlab"]["f1"] == 8.0 and means["transformers"]["f1"] == 8.5
    assert means["pretrainlab"]["f1_sd"] == pytest.approx(2**0.5) and means["transformers"]["n"] == 2
    assert gap == {"exact_match": 0.0, "f1": 0.5}
    assert summary(rows[:2]) == ({}, {})
