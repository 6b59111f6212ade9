"""What each head learned beside its trivial baseline (objectives.learning): the counts against a direct
computation, the verdicts at both ends, and what a run and a study say about it."""

import math

import numpy as np
import pytest
import torch

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.model.heads import IGNORE
from pretrainlab.objectives import learning
from pretrainlab.pretraining.assembly import build_objective
from pretrainlab.tokens import SpecialTokens
from tests.conftest import CONF, SMALL, compose_train, random_documents

MASK = 4
OBJECTIVES = [p.stem for p in sorted((CONF / "objective").glob("*.yaml"))]


def test_masked_counts_split_by_what_the_model_was_shown_and_the_unigram_baseline_is_exact():
    rng = np.random.default_rng(0)
    vocab, n = 50, 4000
    labels = torch.as_tensor(rng.choice(vocab, size=(40, 100), p=np.r_[0.3, np.full(vocab - 1, 0.7 / (vocab - 1))]))
    labels[:, 90:] = IGNORE  # empty slots
    kind = torch.as_tensor(rng.choice(3, size=labels.shape, p=[0.8, 0.1, 0.1]))
    shown = torch.where(
        kind == 0, MASK, torch.where(kind == 1, labels, torch.as_tensor(rng.integers(5, vocab, labels.shape)))
    )
    predicted = torch.where(torch.as_tensor(rng.random(labels.shape) < 0.4), labels, torch.zeros_like(labels))
    hidden = predicted.clamp(min=0)[..., None].float()  # the "hidden state" is the prediction itself

    def logits(h):  # a head that puts 3 nats on its prediction
        return torch.nn.functional.one_hot(h[:, 0].long(), vocab).float() * 3.0

    tally = learning.masked_tally("mlm", logits, hidden, labels, shown, MASK, vocab, chunk=333)
    m = learning.masked_metrics("mlm", learning.to_host(tally))
    real = labels != IGNORE
    truly = torch.where(
        shown == MASK, 0, torch.where(shown == labels, 1, 2)
    )  # a random token equal to the label is "kept"
    for k, name in enumerate(learning.KINDS):
        sel = real & (truly == k)
        assert m[f"mlm_acc_at_{name}"] == pytest.approx(float((predicted[sel] == labels[sel]).float().mean()))
    at_mask = labels[real & (truly == 0)]
    counts = np.bincount(at_mask.numpy(), minlength=vocab)
    assert m["mlm_unigram_acc"] == pytest.approx(counts.max() / counts.sum()) and 0.25 < m["mlm_unigram_acc"] < 0.35
    p = counts[counts > 0] / counts.sum()
    assert m["mlm_unigram_loss"] == pytest.approx(float(-(p * np.log(p)).sum()))  # no training counts: own entropy
    train = rng.integers(0, 1000, vocab)  # with the training text's token counts: their loss, add-one smoothed
    q = (train + 1) / (train + 1).sum()
    with_counts = learning.masked_metrics("mlm", learning.to_host(tally), train)
    assert with_counts["mlm_unigram_loss"] == pytest.approx(float(-(counts * np.log(q)).sum() / counts.sum()))
    assert m["mlm_n_at_mask"] == len(at_mask) > 0.7 * n
    # the verdict: 0.4 + 0.6 * 0.3 ~ 0.58 at [MASK] is under twice the 0.3 baseline
    assert learning.masked_check("MLM at [MASK]", "mlm", m).status == learning.ABOVE
    # tallies add: two halves give the whole
    halves = [
        learning.masked_tally("mlm", logits, hidden[s], labels[s], shown[s], MASK, vocab)
        for s in (slice(0, 17), slice(17, None))
    ]
    whole = learning.to_host(learning.add(learning.add(None, halves[0]), halves[1]))
    assert learning.masked_metrics("mlm", whole) == pytest.approx(m)


def test_auc_from_histograms_is_the_rank_statistic():
    rng = np.random.default_rng(1)
    replaced = torch.as_tensor(rng.random(5000) < 0.15)
    logits = torch.as_tensor(rng.normal(0, 2, 5000) + 1.5 * replaced.numpy() - 2.0, dtype=torch.float32)
    tally = learning.detection_tally("rtd", logits, replaced.float(), torch.ones(5000, dtype=torch.bool))
    m = learning.detection_metrics("rtd", learning.to_host(tally))
    pos, neg = logits[replaced].numpy(), logits[~replaced].numpy()
    exact = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert m["rtd_auc"] == pytest.approx(exact, abs=2e-3) and 0.65 < exact < 0.8
    pred = logits > 0
    assert m["rtd_recall"] == pytest.approx(float((pred & replaced).sum() / replaced.sum()))
    assert m["rtd_precision"] == pytest.approx(float((pred & replaced).sum() / pred.sum()))
    assert m["rtd_acc"] == pytest.approx(float((pred == replaced).float().mean()))
    assert m["rtd_base_acc"] == pytest.approx(1 - float(replaced.float().mean()))


def test_a_detector_that_always_says_original_is_at_its_baseline():
    replaced = torch.as_tensor(np.random.default_rng(2).random((64, 30)) < 0.15).float()
    real = torch.ones_like(replaced, dtype=torch.bool)
    real[:, 25:] = False  # padding is not scored
    m = learning.detection_metrics(
        "rtd", learning.to_host(learning.detection_tally("rtd", torch.full(replaced.shape, -3.0), replaced, real))
    )
    rate = float(replaced[real].mean())
    assert m["rtd_recall"] == 0 and m["rtd_precision"] == 0 and m["rtd_auc"] == pytest.approx(0.5)
    assert m["rtd_acc"] == pytest.approx(1 - rate) == m["rtd_base_acc"]
    assert (
        m["rtd_loss"] > m["rtd_base_loss"] == pytest.approx(-(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)))
    )
    assert learning.detection_check("replaced-token detection", "rtd", m).at_baseline


def _token_detection(seed: int, reads_context: bool):
    """12,000 tokens of a 200-word vocabulary in which the first 40 words are replaced 60% of the time
    and the others 4%; a detector whose logit is each word's log-odds of being replaced (the token alone),
    or that also sees, with noise, whether this occurrence was replaced (its context)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 200, size=12000)
    rate = np.where(ids < 40, 0.6, 0.04)
    replaced = rng.random(12000) < rate
    logits = np.log(rate / (1 - rate)) + (3.0 * replaced - 1.5 + rng.normal(0, 1, 12000) if reads_context else 0.0)
    tally = learning.detection_tally(
        "rtd",
        torch.as_tensor(logits, dtype=torch.float32),
        torch.as_tensor(replaced).float(),
        torch.ones(12000, dtype=torch.bool),
        torch.as_tensor(ids),
        200,
    )
    return learning.detection_metrics("rtd", learning.to_host(tally)), ids, replaced


def test_a_detector_that_reads_only_the_token_is_at_the_token_alone_baseline():
    """Replacements a word gives away by itself (a generator sampling rare words): a detector that knows
    only which words get replaced finds them with a high AUC, which "always original" (0.5) would count
    as past its baseline; beside the token alone, it is at it. One that reads its context is past both."""
    alone, _, _ = _token_detection(3, reads_context=False)
    assert alone["rtd_auc"] > 0.8 and alone["rtd_recall"] > 0.5  # past 0.75 with a tenth found
    assert alone["rtd_token_auc"] == pytest.approx(alone["rtd_auc"], abs=0.01)
    check = learning.detection_check("replaced-token detection", "rtd", alone)
    assert check.status == learning.AT and check.baseline == alone["rtd_token_auc"]
    assert check.baseline_name == "the token alone"
    context, _, _ = _token_detection(3, reads_context=True)
    assert context["rtd_auc"] > context["rtd_token_auc"] + 0.05
    assert learning.detection_check("replaced-token detection", "rtd", context).status == learning.PAST


def test_the_token_alone_auc_is_cross_fitted_and_equals_the_rank_statistic_on_the_other_half():
    """Each half's tokens are scored by the other half's counts (no word scores itself): words seen once
    tell nothing (AUC near 0.5, where scoring a word by its own occurrence would give 1.0), and on the
    synthetic vocabulary it is the exact rank statistic of those scores."""
    ids = torch.arange(6000)  # every word once
    replaced = torch.as_tensor(np.random.default_rng(4).random(6000) < 0.3)
    tally = learning.detection_tally(
        "rtd", torch.zeros(6000), replaced.float(), torch.ones(6000, dtype=torch.bool), ids, 6000
    )
    assert learning.token_alone_auc("rtd", learning.to_host(tally)) == pytest.approx(0.5, abs=1e-9)
    m, ids_np, replaced_np = _token_detection(5, reads_context=False)
    halves = np.arange(len(ids_np)) % 2
    aucs = []
    for fit, judged in ((0, 1), (1, 0)):
        f, j = halves == fit, halves == judged
        rep = np.bincount(ids_np[f & replaced_np], minlength=200)
        seen = np.bincount(ids_np[f], minlength=200)
        share = rep.sum() / seen.sum()
        score = ((rep + share) / (seen + 1.0))[ids_np[j]]
        pos, neg = score[replaced_np[j]], score[~replaced_np[j]]
        aucs.append(
            ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
        )
    assert m["rtd_token_auc"] == pytest.approx(np.mean(aucs), abs=1e-9)
    # without the per-token counts (a tally of logits alone) there is no such baseline: "always original"
    plain = learning.detection_metrics(
        "rtd",
        learning.to_host(
            learning.detection_tally("rtd", torch.zeros(10), torch.zeros(10), torch.ones(10, dtype=torch.bool))
        ),
    )
    assert "rtd_token_auc" not in plain


@pytest.mark.parametrize(
    "correct, status", [(5000, learning.AT), (5150, learning.AT), (5300, learning.ABOVE), (6000, learning.PAST)]
)
def test_pair_heads_are_judged_against_the_majority_label_with_their_sample_size(correct, status):
    tally = {"nsp_n": 10000.0, "nsp_correct": float(correct), "nsp_positive": 5000.0}
    m = learning.pair_metrics("nsp", tally)
    assert m["nsp_majority"] == 0.5 and learning.pair_check("NSP", "nsp", m).status == status


def _batch_and_parts(name: str, seed: int = 0):
    tokens = SpecialTokens(500, 0, 1, 2, 3, MASK, np.zeros(500, dtype=bool))
    config = EncoderConfig(vocab_size=500, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    torch.manual_seed(seed)
    objective = build_objective(compose_train(f"objective={name}"), config, tokens).eval()
    encoder = Encoder(config).eval()
    examples = list(objective.example_builder(48)(random_documents(60, seed), np.random.default_rng(seed)))
    batch = objective.collator()(examples[:32], torch.Generator().manual_seed(seed))
    return tokens, objective, encoder, batch


@pytest.mark.parametrize("name", OBJECTIVES)
def test_every_objective_tallies_its_heads_and_an_untrained_one_is_at_its_baseline(name):
    """Every conf/objective/ option defines its learning check; an untrained model is at its baseline
    on every head; the counts equal the training forward's own metrics on the same batch."""
    tokens, objective, encoder, batch = _batch_and_parts(name)
    with torch.no_grad():
        tally = objective.tally(encoder, batch)
        out = objective(encoder, batch)
    assert tally and all(not v.requires_grad for v in tally.values())
    metrics, checks = objective.learning(learning.to_host(tally))
    assert checks and all(c.at_baseline for c in checks), [c.line() for c in checks]
    if "mlm_acc" in out.metrics:  # the training metric is the accuracy over every selected position
        n = sum(metrics[f"mlm_n_at_{k}"] if k == "mask" else tally[f"mlm_n_{k}"] for k in learning.KINDS)
        hits = sum(tally[f"mlm_correct_{k}"] for k in learning.KINDS)
        assert float(hits / n) == pytest.approx(float(out.metrics["mlm_acc"]), abs=1e-6)
    if "rtd_recall" in out.metrics:  # the same replacements as in training: the same counts
        assert metrics["rtd_recall"] == pytest.approx(float(out.metrics["rtd_recall"]), abs=1e-6)
        assert metrics["rtd_replaced_frac"] == pytest.approx(float(out.metrics["replaced_frac"]), abs=1e-6)
    for pair in ("nsp", "sop"):
        if f"{pair}_acc" in out.metrics:
            assert metrics[f"{pair}_acc"] == pytest.approx(float(out.metrics[f"{pair}_acc"]), abs=1e-6)


@pytest.mark.parametrize("name", ["roberta", "albert"])
def test_accuracy_at_mask_equals_an_independent_full_sequence_computation(name):
    """Independent of the slot layout: run the encoder on the whole corrupted sequences, take the MLM
    head's argmax at every position shown as [MASK] and compare it with the original tokens."""
    tokens, objective, encoder, batch = _batch_and_parts(name, seed=3)
    with torch.no_grad():
        metrics, _ = objective.learning(learning.to_host(objective.tally(encoder, batch)))
        hidden = encoder(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"]).hidden_states
        logits = torch.nn.functional.linear(
            objective.mlm_head.transform(hidden), encoder.embeddings.word_embeddings.weight, objective.mlm_head.bias
        )
    original = batch["input_ids"].clone()
    keep = batch["mlm_labels"] != IGNORE
    rows = torch.arange(len(original))[:, None].expand_as(batch["mlm_positions"])
    original[rows[keep], batch["mlm_positions"][keep]] = batch["mlm_labels"][keep]
    at_mask = batch["input_ids"] == MASK
    assert at_mask.sum() > 100
    direct = (logits.argmax(-1)[at_mask] == original[at_mask]).float().mean()
    assert metrics["mlm_acc_at_mask"] == pytest.approx(float(direct), abs=1e-6)
    counts = torch.bincount(original[at_mask])
    assert metrics["mlm_unigram_acc"] == pytest.approx(float(counts.max() / counts.sum()))


def test_a_model_of_the_training_frequencies_is_at_the_unigram_loss_not_half_a_nat_above_it():
    """The loss baseline is what a model that learned token frequencies from the training text scores at
    the held-out [MASK] positions. The entropy of those few thousand positions' own tokens (the baseline
    once) is far lower on a large vocabulary, and put every masked LM on real text "above unigram"."""
    rng = np.random.default_rng(0)
    vocab = 8000
    zipf = 1.0 / np.arange(1, vocab + 1)
    zipf /= zipf.sum()
    train = np.bincount(rng.choice(vocab, size=2_000_000, p=zipf), minlength=vocab)
    labels = torch.as_tensor(rng.choice(vocab, size=(80, 100), p=zipf))  # 8,000 held-out [MASK] targets
    shown = torch.full_like(labels, MASK)
    log_q = torch.as_tensor(np.log((train + 1) / (train + 1).sum()), dtype=torch.float32)

    def frequencies(h):  # the same distribution at every position: the token frequencies, nothing else
        return log_q.expand(len(h), vocab)

    tally = learning.to_host(
        learning.masked_tally("mlm", frequencies, torch.zeros(*labels.shape, 1), labels, shown, MASK, vocab)
    )
    m = learning.masked_metrics("mlm", tally, train)
    assert m["mlm_loss_at_mask"] == pytest.approx(m["mlm_unigram_loss"], abs=1e-4)
    own_entropy = learning.masked_metrics("mlm", tally)["mlm_unigram_loss"]
    assert m["mlm_unigram_loss"] - own_entropy > 0.3  # the held-out positions' own entropy: far too low
    assert learning.masked_check("MLM at [MASK]", "mlm", m).status == learning.AT


def test_a_run_logs_what_it_learned_and_warns_while_at_its_baseline(tmp_path, caplog):
    from pretrainlab.pretraining.run import run

    with caplog.at_level("INFO", logger="pretrainlab"):
        result = run(compose_train(*SMALL, "objective=bert", "max_steps=4", "val_every=4"), tmp_path)
    heads = {c["head"]: c for c in result["learning"]}
    assert set(heads) == {"MLM at [MASK]", "NSP"} and all(c["status"] == learning.AT for c in heads.values())
    assert result["learning/heads_at_baseline"] == 2
    assert result["learning/mlm_acc_at_mask"] < 1.25 * result["learning/mlm_unigram_acc"]
    assert "every head of bert is still at its trivial baseline" in caplog.text
    assert "learned: MLM at [MASK]" in caplog.text
    # the metrics reach the logger (CSV here; W&B the same way)
    logged = (next(tmp_path.glob("csv/**/metrics.csv"))).read_text().splitlines()[0].split(",")
    assert {"learning/mlm_acc_at_mask", "learning/mlm_unigram_acc", "learning/nsp_majority"} <= set(logged)
    from pretrainlab.pretraining.learning_log import read_rows

    curve = read_rows(tmp_path / "learning.csv")  # whatever the logger: one row per validation
    assert [r["step"] for r in curve] == ["4"] and curve[0]["status:NSP"] == learning.AT
    assert float(curve[0]["mlm_acc_at_mask"]) == pytest.approx(result["learning/mlm_acc_at_mask"])


def test_the_comparison_opens_with_the_runs_at_their_baseline_and_w_and_b_gets_them(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from pretrainlab.compare import write_report
    from pretrainlab.runtime.wandb_runs import log_comparison
    from pretrainlab.studies.intrinsic import learning_markdown, learning_preface
    from tests.test_glue import _result

    def check(head, status, value=0.05):
        return learning.HeadCheck(head, "m", value, 0.05, "most frequent token", status, "").to_dict()

    rows = {
        "roberta-s0": {"objective": "roberta", "metrics": {}, "checks": [check("MLM at [MASK]", learning.AT)]},
        "bert-s0": {
            "objective": "bert",
            "metrics": {},
            "checks": [check("MLM at [MASK]", learning.PAST, 0.3), check("NSP", learning.PAST, 0.9)],
        },
    }
    results = [
        _result(label, "tiny", 0, label, "rte", s, v)
        for label in ("roberta", "bert")
        for s, v in enumerate([0.5, 0.55, 0.6])
    ]
    table = write_report(results, tmp_path, preface=learning_preface(rows), learning=rows)
    md = (tmp_path / "comparison.md").read_text()
    preface = md.split("| encoder")[0]
    assert (
        md.startswith("**Not yet learned: 1 of 2 pretraining runs") and "- roberta-s0: MLM at [MASK] 0.050" in preface
    )
    assert "bert-s0" not in preface
    assert "**at baseline**" in learning_markdown(rows) and learning_preface({"bert-s0": rows["bert-s0"]}) == ""
    # a head learning but not yet past its baseline (ELECTRA's discriminator at AUC 0.72): said before the table too
    electra = {
        "objective": "electra",
        "metrics": {},
        "checks": [check("replaced-token detection", learning.ABOVE, 0.72)],
    }
    said = learning_preface({**rows, "electra-s0": electra})
    assert said.startswith("**Not yet learned: 1 of 3") and "**Still learning: 1 of 3 pretraining runs" in said
    assert "- electra-s0: replaced-token detection 0.720" in said.split("**Still learning")[1]
    assert learning_preface({"electra-s0": electra}).startswith("**Still learning: 1 of 1")
    run_dir = log_comparison(table, tmp_path, mode="offline", group="learning-test")
    offline = Path(run_dir).parent  # <dir>/wandb/offline-run-*/files
    inspected = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(offline)],
        capture_output=True,
        text=True,
    )
    summary = json.loads(inspected.stdout)["summary"]
    assert summary["learning/at_baseline"] == "roberta-s0" and summary["learning/runs_at_baseline"] == 1
    logged = json.loads(next(Path(run_dir).glob("media/table/learning/table_*.table.json")).read_text())
    assert sorted((r[0], r[1], r[5]) for r in logged["data"]) == [
        ("bert-s0", "MLM at [MASK]", "past baseline"),
        ("bert-s0", "NSP", "past baseline"),
        ("roberta-s0", "MLM at [MASK]", "at baseline"),
    ]


def test_the_learning_curve_keeps_one_row_per_validation_and_a_resumed_run_replaces_what_it_redoes(tmp_path):
    from types import SimpleNamespace

    from pretrainlab.pretraining.learning_log import LearningLog, read_rows
    from pretrainlab.studies.intrinsic import learning_curves

    log = LearningLog(tmp_path)
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True)

    def validate(step, value, status):
        row = {
            "step": step,
            "tokens": 100.0 * step,
            "flops": 1e6 * step,
            "mlm_acc_at_mask": value,
            "value:MLM at [MASK]": value,
            "baseline:MLM at [MASK]": 0.1,
            "status:MLM at [MASK]": status,
        }
        log.on_validation_end(trainer, SimpleNamespace(learning_row=row))

    for step, value, status in [(10, 0.1, learning.AT), (20, 0.15, learning.ABOVE), (30, 0.3, learning.PAST)]:
        validate(step, value, status)
    log.on_validation_end(
        SimpleNamespace(sanity_checking=True, is_global_zero=True), SimpleNamespace(learning_row={"step": 0})
    )  # the sanity check writes nothing
    assert [r["step"] for r in read_rows(tmp_path / "learning.csv")] == ["10", "20", "30"]
    validate(20, 0.2, learning.ABOVE)  # resumed from the checkpoint at step 15: 20 is validated again
    validate(30, 0.35, learning.PAST)
    validate(40, 0.4, learning.PAST)
    rows = read_rows(tmp_path / "learning.csv")
    assert [(r["step"], r["mlm_acc_at_mask"]) for r in rows] == [
        ("10", "0.1"),
        ("20", "0.2"),
        ("30", "0.35"),
        ("40", "0.4"),
    ]
    found = learning_curves([tmp_path], tmp_path / "report")
    head = found[tmp_path.name]["MLM at [MASK]"]
    assert head["past_at"] == {"step": 30.0, "tokens": 3000.0, "flops": 3e7} and head["points"] == 4
    md = (tmp_path / "report" / "learning-curves.md").read_text()
    assert f"| {tmp_path.name} | MLM at [MASK] | 30 | 3e+03 | 3e+07 | past baseline | 4 |" in md
    assert (tmp_path / "report" / "learning-curves.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("name", ["roberta", "electra"])
def test_the_transformers_reference_is_judged_on_the_same_held_out_batches(tmp_path, name):
    """experiments/reference.py trains the same-shape transformers model on the run's batches and scores
    it with the same checks: at every evaluation its trivial baselines are the run's own (the same
    held-out positions), and it learns (a reference stuck at chance would say nothing). ELECTRA's detection
    is judged beside the token alone on the replacements its own generator made, so that baseline is each
    model's own: both are the token alone's AUC, each above 0.5."""
    import csv
    import sys

    from pretrainlab.pretraining.learning_log import read_rows
    from pretrainlab.pretraining.run import run
    from tests.conftest import ROOT, run_command

    run(compose_train(*SMALL, f"objective={name}", "max_steps=30", "val_every=15", "checkpoint_every=30"), tmp_path)
    out = tmp_path / "reference.csv"
    done = run_command(
        [
            sys.executable,
            str(ROOT / "experiments" / "reference.py"),
            str(tmp_path),
            "--eval-batches",
            "2",
            "--out",
            str(out),
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours = {r["step"]: r for r in read_rows(tmp_path / "learning.csv")}
    theirs = list(csv.DictReader(out.open()))
    assert [r["step"] for r in theirs] == ["15", "30"] == list(ours)
    heads = [k.split(":", 1)[1] for k in theirs[0] if k.startswith("baseline:")]
    assert heads and set(heads) == {k.split(":", 1)[1] for k in ours["15"] if k.startswith("baseline:")}
    for row in theirs:
        for head in heads:
            if head == "replaced-token detection":
                assert all(0.5 < float(r[f"baseline:{head}"]) < 1 for r in (row, ours[row["step"]]))
                continue
            assert float(row[f"baseline:{head}"]) == pytest.approx(float(ours[row["step"]][f"baseline:{head}"]))
    first = "MLM at [MASK]" if name == "roberta" else "generator at [MASK]"
    assert float(theirs[-1][f"value:{first}"]) > float(theirs[-1][f"baseline:{first}"])
    assert f"step 30  {first}: reference" in done.stderr + done.stdout


@pytest.mark.slow
def test_the_reference_follows_a_budgeted_runs_schedule_and_can_stop_early_in_it(tmp_path):
    """A run trained to a token budget: the reference counts the same tokens and ends at the step the run
    ended at; with --steps it stops early with the learning rate of that step of the run's schedule (not a
    schedule squeezed into --steps, which would end at its floor)."""
    import csv
    import sys

    from pretrainlab.pretraining.learning_log import read_rows
    from pretrainlab.pretraining.run import run
    from tests.conftest import ROOT, run_command

    run(compose_train(*SMALL, "objective=bert", "budget.tokens=20000", "val_every=8", "checkpoint_every=100"), tmp_path)
    ours = [int(r["step"]) for r in read_rows(tmp_path / "learning.csv")]

    def reference(out, *extra):
        done = run_command(
            [sys.executable, str(ROOT / "experiments" / "reference.py"), str(tmp_path), "--eval-batches", "1"]
            + ["--eval-every", "8", "--out", str(out), *extra]
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return list(csv.DictReader(out.open()))

    whole = reference(tmp_path / "whole.csv")
    assert [int(r["step"]) for r in whole] == ours and ours[-1] > 16
    early = reference(tmp_path / "early.csv", "--steps", "16")
    assert [int(r["step"]) for r in early] == [8, 16]
    assert float(early[-1]["lr"]) == pytest.approx(float(whole[1]["lr"])) and float(early[-1]["lr"]) > float(
        whole[-1]["lr"]
    )
    assert {"mlm_loss_at_mask", "lr"} <= set(early[-1])


def test_the_reference_never_writes_over_an_existing_file(tmp_path):
    """--out names a file that exists: refused before any training, the file untouched."""
    import sys

    from tests.conftest import ROOT, run_command

    out = tmp_path / "mine.csv"
    out.write_text("a user's file\n")
    done = run_command(
        [sys.executable, str(ROOT / "experiments" / "reference.py"), str(tmp_path / "no-run"), "--out", str(out)]
    )
    assert done.returncode == 2 and "already exists" in done.stderr and str(out) in done.stderr, done.stderr[-2000:]
    assert out.read_text() == "a user's file\n"


def test_the_learning_curves_figure_gives_an_objective_one_colour_and_one_legend_entry_per_head(tmp_path, monkeypatch):
    """With nine runs of three objectives, the figure's colours must say the objective, not cycle."""
    from pretrainlab import figures
    from pretrainlab.studies import intrinsic

    captured = {}
    monkeypatch.setattr(figures, "save", lambda fig, path: captured.setdefault("fig", fig) and path)
    curves = {
        (f"{objective}-s{seed}", head): [(1e12, 1.0, False), (1e13, 2.5, True)]
        for objective, heads in {"bert": ["MLM at [MASK]", "NSP"], "roberta": ["MLM at [MASK]"]}.items()
        for head in heads
        for seed in range(3)
    }
    intrinsic._plot_learning(curves, tmp_path / "curves.png")
    ax = captured["fig"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    colour = {}
    for line in ax.get_lines()[:-1]:  # the last line is the baseline
        colour.setdefault(line.get_color(), set()).add(line.get_linestyle())
    assert len(ax.get_lines()) == 9 + 1 and len(colour) == 2  # bert and roberta
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["bert: MLM at [MASK]", "bert: NSP", "roberta: MLM at [MASK]", "trivial baseline"]
    assert lines["bert: MLM at [MASK]"].get_color() != lines["roberta: MLM at [MASK]"].get_color()
    assert lines["bert: MLM at [MASK]"].get_linestyle() != lines["bert: NSP"].get_linestyle()


def test_a_collapsed_encoder_is_told_from_one_on_its_plateau():
    """The encoder's final states: an encoder whose every token ends in one state (what held XLNet at its
    unigram baseline on the GPU) is collapsed, with one answer at [MASK]; a fresh one tells its tokens
    apart. The cosine is the mean over distinct pairs, and tallies of batches add up to the whole's."""
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    encoder = Encoder(cfg).eval()
    ids = torch.randint(5, 60, (6, 20))
    mask = torch.ones_like(ids)
    mask[:, 15:] = 0  # padding is left out
    batch = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        fresh = learning.states_metrics(learning.to_host(learning.states_tally(encoder, batch)))
        states = encoder(ids, None, mask).hidden_states[mask.bool()]
        unit = torch.nn.functional.normalize(states, dim=-1).double()
        pairs = unit @ unit.T
        n = len(unit)
        assert fresh["hidden_cosine"] == pytest.approx(float((pairs.sum() - n) / (n * (n - 1))), abs=1e-6)
        halves = [
            learning.states_tally(encoder, {k: v[s] for k, v in batch.items()}) for s in (slice(0, 2), slice(2, None))
        ]
        whole = learning.states_metrics(learning.to_host(learning.add(learning.add(None, halves[0]), halves[1])))
        assert whole["hidden_cosine"] == pytest.approx(fresh["hidden_cosine"], abs=1e-6)
        assert fresh["hidden_cosine"] < 0.5 and "tokens told apart" in learning.states_line(fresh)
        last = encoder.layers[-1].ffn_norm  # every token's last state the same vector: collapsed
        last.weight.zero_(), last.bias.normal_()
        collapsed = learning.states_metrics(learning.to_host(learning.states_tally(encoder, batch)))
    assert collapsed["hidden_cosine"] > learning.COLLAPSED and "collapsed" in learning.states_line(collapsed)

    # one answer at every [MASK]: the masked check says how many distinct answers there were
    labels = torch.randint(0, 50, (10, 8))
    shown = torch.full_like(labels, MASK)
    hidden = torch.zeros(10, 8, 4)
    m = learning.masked_metrics(
        "mlm",
        learning.to_host(
            learning.masked_tally("mlm", lambda h: h @ torch.ones(4, 50), hidden, labels, shown, MASK, 50)
        ),
    )
    assert m["mlm_distinct_answers"] == 1 and m["mlm_top_answer_share"] == 1.0
    assert "1 distinct answer(s) at [MASK]" in learning.masked_check("MLM at [MASK]", "mlm", m).detail


def test_a_run_and_a_study_say_whether_the_encoder_collapsed(tmp_path, caplog):
    """Every validation's row of learning.csv holds the hidden cosine, the run's summary says what it
    means, and a study's learning.md has a line for each run's encoder."""
    from pretrainlab.pretraining.learning_log import read_rows
    from pretrainlab.pretraining.run import run
    from pretrainlab.studies.intrinsic import learning_markdown

    with caplog.at_level("INFO", logger="pretrainlab"):
        run(compose_train(*SMALL, "objective=xlnet", "max_steps=4", "val_every=2"), tmp_path)
    curve = read_rows(tmp_path / "learning.csv")
    assert [r["step"] for r in curve] == ["2", "4"]
    assert all(0.0 < float(r["hidden_cosine"]) < 1.0 for r in curve) and "plm_distinct_answers" in curve[-1]
    assert "encoder: final states' mean cosine" in caplog.text
    row = {"objective": "xlnet", "metrics": {"hidden_cosine": 0.99998}, "checks": []}
    assert "| xlnet-s0 | encoder | | | **collapsed** | final states' mean cosine 1.00" in learning_markdown(
        {"xlnet-s0": row}
    )
    row["metrics"]["hidden_cosine"] = 0.2
    assert "| xlnet-s0 | encoder | | | not collapsed |" in learning_markdown({"xlnet-s0": row})
    # the comparison's opening warning says which of the runs at their baseline collapsed
    from pretrainlab.studies.intrinsic import learning_preface

    at = learning.HeadCheck("PLM at its targets", "plm_acc_at_mask", 0.05, 0.05, "most frequent token", learning.AT)
    row["checks"] = [at.to_dict()]
    assert "collapsed" not in learning_preface({"xlnet-s0": row})
    row["metrics"]["hidden_cosine"] = 0.99998
    assert "PLM at its targets 0.050" in learning_preface(
        {"xlnet-s0": row}
    ) and "(collapsed: every token looks alike)" in (learning_preface({"xlnet-s0": row}))


def test_a_learning_report_says_the_detection_rule_its_rows_were_judged_by():
    """learning.md (and the docs generated from a published learning.json) states the rule its verdicts were
    made by: beside the token alone for rows judged so, beside "always original" alone for a report made
    before (whose verdicts that rule gave), so that an old report does not read as judged by the new one."""
    from pretrainlab.studies.intrinsic import learning_markdown

    def rows(baseline_name: str, **extra) -> dict:
        check = learning.HeadCheck("replaced-token detection", "rtd_auc", 0.7, 0.6, baseline_name, learning.ABOVE)
        return {"electra-s0": {"objective": "electra", "metrics": {}, "checks": [check.to_dict()], **extra}}

    new = learning_markdown(rows("the token alone", baselines=learning.BASELINE_VERSION))
    old = learning_markdown(rows("always original"))
    assert "beside a detector that sees each token alone" in new and "0.05 over the token alone's" in new
    assert "token alone" not in old.split("| electra-s0 |")[-1].split("\n", 1)[1]
    assert 'AUC beside always answering "original" (0.5; past: AUC >= 0.75 with a tenth' in old


def test_a_slots_recorded_checks_made_by_earlier_baselines_are_kept_and_said_to_be_theirs(tmp_path):
    """A slot brings its runs back without weights, their held-out checks in intrinsic.json: one made before the
    token-alone baseline (version 2) cannot be judged again, so merging it keeps its rows as they were judged
    (bumping the version had left every such row out of the merged report) and its learning.md says the
    rule that judged them."""
    import json

    from pretrainlab.studies.intrinsic import learning_report

    check = learning.HeadCheck("replaced-token detection", "rtd_auc", 0.72, 0.5, "always original", learning.ABOVE)
    runs = []
    for seed in (0, 1):
        run = tmp_path / "pretrain" / f"electra-s{seed}"
        run.mkdir(parents=True)
        own = {"learning": {"objective": "electra", "metrics": {"rtd_auc": 0.72}, "checks": [check.to_dict()]}}
        (run / "intrinsic.json").write_text(json.dumps({"baselines": 2, "own": own}))
        runs.append(run)
    rows = learning_report(runs, tmp_path / "report", recorded=True)
    assert sorted(rows) == ["electra-s0", "electra-s1"] and all(r["baselines"] == 2 for r in rows.values())
    md = (tmp_path / "report" / "learning.md").read_text()
    assert "| electra-s0 | replaced-token detection | 0.720 | 0.500 (always original) | above baseline |" in md
    assert 'AUC beside always answering "original" (0.5; past: AUC >= 0.75 with a tenth' in md
