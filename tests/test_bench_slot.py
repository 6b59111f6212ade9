"""experiments/bench_slot.py on the CPU: the machinery that times the slot's runs today and with each
lever (workers, windows, the fused group, the report) works before a GPU is lent; the numbers here
say nothing of a GPU's."""

import json

import pytest

from pretrainlab.tools import bench_slot


def test_the_slot_bench_times_each_configuration_side_by_side_and_writes_its_report(tmp_path, caplog):
    report = tmp_path / "report"
    code = bench_slot.main(
        [
            "--device", "cpu", "--model", "tiny", "--batch", "4", "--seq-len", "64", "--vocab", "400",
            "--objectives", "roberta,clm,electra", "--levers", "today,batch,fused,graphs,mps+graphs",
            "--eager", "--window-s", "1", "--warmup-steps", "1", "--work", str(tmp_path / "work"),
            "--report", str(report),
        ]
    )  # fmt: skip
    assert code == 0
    assert "graphs, mps+graphs: CUDA graphs and MPS need a CUDA device; not timed on cpu" in caplog.text
    table = json.loads((report / "report.json").read_text())
    rows = {row[0]: dict(zip(table["columns"], row, strict=True)) for row in table["rows"]}
    assert list(rows) == ["today", "batch", "fused"]
    assert all(r["status"] == "ok" for r in rows.values())
    assert rows["today"]["x today"] == "1.00x" and rows["batch"]["x today"].endswith("x")
    assert rows["today"]["processes"] == "3" and rows["fused"]["processes"] == "2"  # roberta+clm fused, electra alone
    assert "fused group: roberta, clm" in table["about"]
    details = json.loads((report / "bench-slot.json").read_text())["rows"]
    assert details["fused"]["runs"] == 3 and details["fused"]["steps"]["fused"] >= 1
    assert details["today"]["flops_per_s"] > 0 and details["batch"]["tokens_per_s"] > 0
    provenance = json.loads((report / "provenance.json").read_text())
    assert provenance["command"].startswith("python") and provenance["device"]


def test_the_fusable_objectives_are_those_that_name_one_encoder_call_on_one_shape():
    fused, alone = bench_slot.groups(
        ["albert", "bert", "clm", "clm_mlm", "electra", "gpt_bert", "roberta", "spanbert", "xlnet"], "tiny"
    )
    assert fused == ["albert", "bert", "clm", "clm_mlm", "gpt_bert", "roberta", "spanbert"]
    assert alone == ["electra", "xlnet"]
    # encoders whose layers are one set of weights (ALBERT's sharing) are not stacked
    assert bench_slot.groups(["albert", "roberta"], "albert_base") == ([], ["albert", "roberta"])


def test_a_question_slots_runs_are_copies_of_each_objective_and_fuse_by_objective():
    """``--copies 3`` times a question slot's runs (each arm's three pretraining seeds, seeded apart);
    ``--fuse objective`` trains each fusable objective's copies as one model (one masking, one head, one
    attention pattern), where ``shape`` fuses every run of one encoder shape whatever its objective."""
    runs = bench_slot.copies_of(["roberta", "clm", "electra"], 3)
    assert list(runs)[:3] == ["roberta-s0", "roberta-s1", "roberta-s2"] and runs["electra-s2"] == ("electra", 2)
    assert bench_slot.copies_of(["roberta"], 1) == {"roberta": ("roberta", 0)}
    by_objective = bench_slot.fused_groups(runs, "tiny", None, "objective")
    assert by_objective == [["roberta-s0", "roberta-s1", "roberta-s2"], ["clm-s0", "clm-s1", "clm-s2"]]
    by_shape = bench_slot.fused_groups(runs, "tiny", None, "shape")
    assert by_shape == [["roberta-s0", "roberta-s1", "roberta-s2", "clm-s0", "clm-s1", "clm-s2"]]
    assert bench_slot.fused_groups(bench_slot.copies_of(["roberta", "electra"], 1), "tiny", None, "objective") == []
    workers, configs = bench_slot.plan(runs, by_objective, ["today", "mps+fused+graphs"], 256, 2)
    today, fused = configs
    assert sorted(today.members) == sorted(runs) and not today.mps
    assert fused.mps and fused.members == {
        "fused-roberta": "fused-graphs",
        "fused-clm": "fused-graphs",
        **{f"electra-s{k}": "graphs" for k in range(3)},
    }
    assert workers["fused-roberta"]["seeds"] == [0, 1, 2] and workers["fused-roberta"]["objectives"] == ["roberta"] * 3
    assert workers["electra-s1"] == {
        "objectives": ["electra"],
        "seeds": [1],
        "fused": False,
        "variants": {
            "default": {"batch": 256, "mode": "default", "static": False},
            "graphs": workers["electra-s1"]["variants"]["graphs"],
        },
    }


def test_the_bench_refuses_what_it_cannot_time_and_folders_it_did_not_make(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    for argv, says in [
        (["--objectives", "robrta"], "--objectives robrta: choose among albert"),
        (["--batch", "0"], "--batch 0: give a whole number of 1 or more"),
        (["--window-s", "inf"], "--window-s inf: give a number of seconds above 0"),
        (["--levers", "today,warp"], "--levers: warp unknown"),
        (["--report", str(mine)], "a new or empty folder (or one this bench wrote)"),
        (["--work", str(mine / "report.md")], "a new or empty folder"),
    ]:
        with pytest.raises(SystemExit):
            bench_slot.main(["--device", "cpu", "--eager", *argv])
        assert says in capsys.readouterr().err
    assert (mine / "report.md").read_text() == "my notes" and sorted(p.name for p in mine.iterdir()) == ["report.md"]
