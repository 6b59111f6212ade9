"""Settings and inputs that used to crash far from their cause, or train on nothing, are refused
naming the setting and the fix, before any work; or they now work (a batch with nothing to predict,
a folder of text files without an extension)."""

import argparse
import json

import pytest
import torch

from pretrainlab.config import ConfigError
from pretrainlab.pretraining.run import run
from tests.conftest import SMALL, compose_config, compose_train


def _no_work(monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("the corpus was read before the settings were checked")

    monkeypatch.setattr("pretrainlab.pretraining.run.PretrainData", no_work)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["objective=spanbert", "objective.sbo_weight=-1"],
            r"objective.sbo_weight=-1 \(objective=spanbert\): a loss weight must be a finite number >= 0",
        ),
        (["objective=bert", "objective.pair_weight=nan"], r"objective.pair_weight=nan \(objective=bert\)"),
        (["objective=electra", "objective.disc_weight=-50"], r"objective.disc_weight=-50 \(objective=electra\)"),
        (
            ["objective=xlnet", "objective.partial_prediction=100", "max_seq_len=16"],
            r"objective.partial_prediction=100 \(objective=xlnet\) leaves 0.14 prediction targets in a sequence "
            r"of max_seq_len=16",
        ),
        (
            ["objective=spanbert", "objective.mask_rate=0.001"],
            r"objective.mask_rate=0.001 \(objective=spanbert\) leaves 0.06 prediction targets",
        ),
        (
            ["objective=roberta", "objective.mask_rate_start=0.005"],
            r"objective.mask_rate_start=0.005 \(objective=roberta\) leaves 0.31",
        ),
        (  # 2e5 for 2e15: a run of one step, whose results would say nothing
            ["objective=roberta", "budget.flops=2e5"],
            r"budget.flops=2e\+05 is less than one optimizer step of this run \(at least .* FLOPs: 16 sequences x 64 "
            r"tokens x .* FLOPs per token\): it would stop after its first step",
        ),
        (
            ["objective=electra", "budget.tokens=100"],
            r"budget.tokens=100 is less than one optimizer step .*16 sequences x 64 tokens\)",
        ),
        (
            ["objective=clm", "+objective.mask_rate_start=0.3"],
            r"objective.mask_rate_start is not a setting of objective=clm .*belongs to albert, bert, clm_mlm, electra",
        ),
    ],
)
def test_objective_settings_that_cannot_train_are_refused_before_any_work(tmp_path, monkeypatch, overrides, message):
    _no_work(monkeypatch)
    with pytest.raises(ConfigError, match=message):
        run(compose_train(*SMALL, "max_steps=2", *overrides), tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_the_default_sequences_and_rates_are_not_refused():
    """The smallest sequence the settings allow (8 tokens) at every objective's defaults holds enough
    targets: the refusal is for settings that leave (almost) nothing to predict."""
    from pretrainlab.objectives.base import check_targets
    from pretrainlab.pretraining.run import validate
    from pretrainlab.runtime.hydra import options

    for objective in options("objective"):
        cfg = compose_train(*SMALL, f"objective={objective}", "max_seq_len=8")
        validate(cfg)  # builds the objective and checks its targets at max_seq_len=8
    from pretrainlab.pretraining.assembly import build_objective

    cfg = compose_train(*SMALL, "objective=roberta", "objective.mask_rate=0.01")
    encoder_config, _ = validate(compose_train(*SMALL, "objective=roberta"))
    with torch.device("meta"):
        objective = build_objective(cfg, encoder_config, _tokens(encoder_config.vocab_size))
    with pytest.raises(ConfigError, match="raise max_seq_len"):
        check_targets(objective, 16)
    check_targets(objective, 128)  # 1.26 targets a sequence


def _tokens(vocab):
    import numpy as np

    from pretrainlab.tokens import SpecialTokens

    return SpecialTokens(vocab, 0, 1, 2, 3, 4, np.zeros(vocab, dtype=bool))


@pytest.mark.parametrize("eager", [True, False])
def test_a_batch_with_nothing_to_predict_has_zero_loss_not_nan(monkeypatch, eager):
    """A masked LM's batch can hold no masked token (a low rate, short sequences): its loss is 0 with
    no gradient, where the mean over no tokens used to be NaN (and the run stopped advising a lower
    learning rate). With targets, the loss is the usual mean."""
    from pretrainlab.model import heads
    from pretrainlab.model.heads import IGNORE, MaskedLMHead

    monkeypatch.setattr(heads, "eager_cpu", lambda t: eager)
    torch.manual_seed(0)
    head, emb = MaskedLMHead(16, 16, 50), torch.nn.Parameter(torch.randn(50, 16))
    hidden = torch.randn(2, 5, 16, requires_grad=True)
    none = torch.full((2, 5), IGNORE)
    loss, acc = head.loss(hidden, emb, none)
    loss.backward()
    assert loss.item() == 0.0 and acc.item() == 0.0 and torch.isfinite(hidden.grad).all()
    assert hidden.grad.abs().sum() == 0 and emb.grad is not None and emb.grad.abs().sum() == 0
    labels = none.clone()
    labels[0, 1], labels[1, 3] = 7, 9
    loss, _ = head.loss(hidden, emb, labels)
    logits = torch.nn.functional.linear(head.transform(hidden[labels != IGNORE]), emb, head.bias)
    expected = torch.nn.functional.cross_entropy(logits, labels[labels != IGNORE])
    assert torch.allclose(loss, expected, atol=1e-5)


# --- the reference tools' command lines ------------------------------------------------------------------
@pytest.mark.parametrize("tool", ["glue_reference", "squad_reference"])
@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "x"], "'x': give comma-separated integers"),
        (["--seeds", "0,0"], "'0,0' names a seed twice"),
        (["--seeds", "-1"], "non-negative"),
        (["--out", "{file}/sub"], "cannot write there"),
        (["--out", "{full}"], "already holds files"),
    ],
)
def test_reference_tools_refuse_bad_arguments_before_any_work(tmp_path, capsys, monkeypatch, tool, args, message):
    import importlib

    module = importlib.import_module(f"pretrainlab.tools.{tool}")
    (tmp_path / "file").write_text("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "results.csv").write_text("kept")
    monkeypatch.setattr(module, "export_hf", lambda *a, **k: pytest.fail("exported before the arguments were checked"))
    monkeypatch.setattr(module, "compose", lambda *a, **k: pytest.fail("composed before the arguments were checked"))
    args = [a.format(file=tmp_path / "file", full=tmp_path / "full") for a in args]
    with pytest.raises(SystemExit) as e:
        module.main([str(tmp_path / "no-run"), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert (tmp_path / "full" / "results.csv").read_text() == "kept"


def test_reference_tools_write_to_a_named_folder_not_a_temporary_one(tmp_path, monkeypatch):
    from pretrainlab.tools.cli import output_dir

    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    out = output_dir(parser, None, "glue")
    assert out.parent == __import__("pathlib").Path("runs/references") and out.name.startswith("glue-")
    assert out.is_dir() and not any(out.iterdir())


# --- corpora -----------------------------------------------------------------------------------------------
def test_a_folder_of_text_files_without_an_extension_is_read_as_text(tmp_path, caplog):
    from pretrainlab.data.corpus import TextFiles

    news = tmp_path / "news"
    news.mkdir()
    for i in range(3):
        (news / f"{i:05d}").write_text(f"Story {i} begins here. It has a second sentence.\n")
    (news / ".hidden").write_text("not a story")
    corpus = TextFiles(files=[str(news)])
    assert [p.name for p in corpus.resolve()] == ["00000", "00001", "00002"]
    assert corpus.describe() == "3 local file(s) (3 without an extension, read as plain text)"
    docs = list(corpus.documents(tmp_path / "cache"))
    assert len(docs) >= 3 and "Story 1 begins here." in json.dumps(docs)
    # beside files with an extension, a file without one is not part of the corpus (a README)
    (news / "story.txt").write_text("A typed story. With two sentences.\n")
    (news / "other.txt").write_text("Another typed story. Also two.\n")
    assert [p.name for p in corpus.resolve()] == ["other.txt", "story.txt"]


# --- studies -------------------------------------------------------------------------------------------------
def test_a_data_folder_a_study_preset_would_ignore_is_refused_before_any_pretraining(tmp_path, monkeypatch):
    """ablate_quick reads BLiMP from its synthetic set: a data_dirs.blimp given beside it was ignored in silence."""
    from pretrainlab.pretraining import run as pretraining
    from pretrainlab.studies import ablation

    monkeypatch.setattr(
        pretraining, "run", lambda *a, **k: pytest.fail("pretraining started before the inputs were checked")
    )
    cfg = compose_config("ablate_quick", f"output_root={tmp_path}", "objectives=[roberta]")
    cfg.data_dirs.blimp = str(tmp_path / "missing")
    with pytest.raises(
        ConfigError, match=r"data_dirs.blimp=.*missing, but this study reads blimp from its synthetic set"
    ):
        ablation.run_study(cfg)


def test_a_studys_squad_folder_is_a_data_dir_like_the_others_and_checked_before_any_pretraining(tmp_path, monkeypatch):
    """data_dirs holds every evaluation data block's folder, SQuAD's too (it once had no key there)."""
    from pretrainlab.pretraining import run as pretraining
    from pretrainlab.studies import ablation

    monkeypatch.setattr(
        pretraining, "run", lambda *a, **k: pytest.fail("pretraining started before the inputs were checked")
    )
    cfg = compose_config("ablate_quick", f"output_root={tmp_path}", "objectives=[roberta]", "evals=[squad]")
    cfg.suite.overrides = [o for o in cfg.suite.overrides if "max_seq_len" not in o]  # SQuAD's windows need more
    cfg.data_dirs.squad = str(tmp_path / "no-squad-here")
    with pytest.raises(
        ConfigError, match=r"evaluation squad of the study \(checked before any pretraining\).*no-squad-here"
    ):
        ablation.run_study(cfg)


def test_a_study_checks_its_evaluation_data_before_any_pretraining(tmp_path, monkeypatch):
    from pretrainlab.pretraining import run as pretraining
    from pretrainlab.studies import ablation

    monkeypatch.setattr(
        pretraining, "run", lambda *a, **k: pytest.fail("pretraining started before the inputs were checked")
    )
    cfg = compose_config("ablate_quick", f"output_root={tmp_path}", "objectives=[roberta]")
    cfg.suite.overrides = [o for o in cfg.suite.overrides if not o.startswith("glue.source")]
    cfg.data_dirs.glue = str(tmp_path / "no-glue-here")
    with pytest.raises(
        ConfigError, match=r"evaluation cola of the study \(checked before any pretraining\).*no-glue-here"
    ):
        ablation.run_study(cfg)
    assert not (tmp_path / "quick" / "pretrain").exists() or not any((tmp_path / "quick" / "pretrain").iterdir())
