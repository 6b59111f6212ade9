"""A whole ablation study from one command, offline, at a small compute budget: two objectives
pretrained to the same FLOPs with two seeds each, the GLUE suite on each and on scratch, the
report; then resumed."""

import json

import pytest
import torch

from tests.conftest import SMALL, compose_config


def test_ablation_study_end_to_end_and_resumable(tmp_path, monkeypatch):
    from pretrainlab.studies.ablation import run_study

    pretrain = [*SMALL, "data.num_documents=200", "budget.flops=1.5e11", "checkpoint_every=1000", "val_every=1000"]
    glue = ["glue.source=synthetic", "glue.synthetic.scale=0.1", "task_overrides.epochs=1",
            "task_overrides.lr=3.0e-4", "task_overrides.max_seq_len=64", "logger=csv",
            "trainer.enable_progress_bar=false"]
    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    overrides = ["study=small", f"output_root={tmp_path}", "objectives=[roberta,electra]", "seeds=[0,1]",
                 f"pretrain={quoted(pretrain)}", "glue.tasks=[rte,cola]", "glue.seeds=[0]",
                 f"glue.overrides={quoted(glue)}"]
    table = run_study(compose_config("ablate", *overrides))

    root = tmp_path / "small"
    assert table["labels"] == ["electra", "roberta", "scratch"] and table["tasks"] == ["cola", "rte"]
    for name in ("comparison.md", "comparison.csv", "comparison.png", "comparison.json"):
        assert (root / "report" / name).is_file()
    flops = {}
    for objective in ("roberta", "electra"):
        meta = json.loads((root / "pretrain" / f"{objective}-s0" / "encoder" / "config.json").read_text())
        flops[objective] = meta["pretraining"]["flops"]
        result = json.loads((root / "pretrain" / f"{objective}-s0" / "glue" / "rte" / "seed0.json").read_text())
        assert result["label"] == objective and result["pretrained"]["objective"] == objective
    assert all(1.5e11 <= f < 1.5e11 * 1.2 for f in flops.values()), flops  # the same budget for both
    assert (root / "pretrain" / "roberta-s0" / "glue-scratch" / "cola" / "seed0.json").is_file()
    # both pretraining seeds of each objective are in its row: the spread over them is reported
    for objective in ("roberta", "electra"):
        assert sorted(e["pretrain_seed"] for e in table["encoders"][objective]) == [0, 1]
        scores = [100 * json.loads((root / "pretrain" / f"{objective}-s{s}" / "glue" / "rte" / "seed0.json")
                                   .read_text())["metrics"]["accuracy"] for s in (0, 1)]
        cell = table["cells"][objective]["rte"]
        assert cell["score"][0] == pytest.approx(sum(scores) / 2) and cell["encoders"] == 2
        assert cell["pretrain_sd"]["score"] == pytest.approx(abs(scores[0] - scores[1]) / 2 ** 0.5)

    def fail(*a, **k):
        raise AssertionError("finished work was redone")

    monkeypatch.setattr("pretrainlab.pretraining.run.run", fail)
    monkeypatch.setattr("pretrainlab.finetuning.run.run", fail)
    again = run_study(compose_config("ablate", *overrides))
    assert json.loads(json.dumps(again)) == json.loads((root / "report" / "comparison.json").read_text())
