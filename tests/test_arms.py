"""Recipe arms (pretrainlab.tools.arms): the arms file and command line checked before any run, when a
head left its baseline read off its learning curve, and a whole command on the CPU."""

import json
import sys

import pytest

from pretrainlab.objectives.learning import ABOVE, AT, PAST
from pretrainlab.tools import arms
from tests.conftest import SMALL


def _file(tmp_path, text, name="arms.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, says",
    [
        ("arms: {}", "give `arms:`"),
        ("common: [model=tiny]", "give `arms:`"),
        ("arms: {a: objective=bert}", "must be a list of train.py overrides"),
        ("arms: {'../up': [objective=bert]}", "not a safe folder name"),
        ("arms: {'.': [objective=bert]}", "not a safe folder name"),
        ("arms: {a: [objective=bert]}\nextra: 1", "unknown key(s) ['extra']"),
        ("arms: {a: [objective=bert]}\ncommon: model=tiny", "`common` must be a list"),
        ("arms: [", "not readable YAML"),
    ],
)
def test_an_arms_file_that_cannot_be_run_is_refused_naming_the_cause(tmp_path, text, says):
    with pytest.raises(arms.ArmsError, match="arms.yaml") as e:
        arms.load_arms(_file(tmp_path, text))
    assert says in str(e.value)


def test_two_arms_that_compose_the_same_run_or_an_unknown_override_are_refused_before_any_run(tmp_path, capsys):
    with pytest.raises(arms.ArmsError, match="arms 'a' and 'b' compose the same run"):
        arms.compose_arms(["model=tiny"], {"a": ["objective=bert"], "b": ["objective=bert", "model=tiny"]})
    with pytest.raises(arms.ArmsError, match="arm 'a'.*does not compose"):
        arms.compose_arms([], {"a": ["objective=bert", "objective.no_such_key=1"]})
    path = _file(tmp_path, "arms: {a: [objective=bert], b: [objective=roberta]}")
    out = tmp_path / "out"
    for argv, says in [
        ([str(path), "--out", str(out), "--only", "c"], "--only c: not an arm"),
        ([str(path), "--out", str(out), "--minutes", "-1"], "give a positive, finite number of minutes"),
        ([str(path), "--out", str(out), "--minutes", "inf"], "give a positive, finite number of minutes"),
        ([str(path), "--out", str(out), "--report-only"], "nothing to report"),
    ]:
        with pytest.raises(SystemExit):
            arms.main(argv)
        assert says in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written


def test_an_out_that_is_a_file_or_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path, capsys):
    """--out must be a new or empty folder, or one an arms run made: a user's folder is never written
    into (its report/report.md, logs/ and runs/ were once overwritten, exit 0)."""
    path = _file(tmp_path, "arms: {a: [objective=bert], b: [objective=roberta]}")
    mine = tmp_path / "mine"
    (mine / "report").mkdir(parents=True)
    (mine / "report" / "report.md").write_text("my own notes")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    for out, says in [(mine, "holds files an arms run did not make"), (a_file, "is a file")]:
        with pytest.raises(SystemExit):
            arms.main([str(path), "--out", str(out)])
        assert says in capsys.readouterr().err
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["report", "report/report.md"]
    assert (mine / "report" / "report.md").read_text() == "my own notes" and a_file.read_text() == "keep me"


def test_an_arm_name_too_long_for_a_wandb_tag_is_refused(tmp_path):
    name = "a" * 65
    with pytest.raises(arms.ArmsError, match="1 to 64 letters"):
        arms.load_arms(_file(tmp_path, f"arms: {{{name}: [objective=bert]}}"))
    assert arms.load_arms(_file(tmp_path, f"arms: {{{name[:64]}: [objective=bert]}}"))[2]


def test_ctrl_c_stops_the_arms_with_the_command_that_continues_them(tmp_path, monkeypatch, caplog):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(arms, "run_parallel", interrupted)
    path = _file(tmp_path, "arms: {a: [objective=bert], b: [objective=roberta]}")
    assert arms.main([str(path), "--out", str(tmp_path / "out"), "model=tiny"]) == 130
    assert "Ctrl-C: the arms stopped (each run saved its checkpoint). Continue them with:" in caplog.text
    assert caplog.text.split("Continue them with:")[1].lstrip().startswith("python")  # this process's command


def _row(step, *statuses):
    row = {"step": str(step), "tokens": str(step * 10), "flops": str(step * 1e9)}
    for head, status in zip(["MLM at [MASK]", "NSP"], statuses, strict=False):
        row |= {f"status:{head}": status, f"value:{head}": "0.1", f"baseline:{head}": "0.05"}
    return row


def test_above_and_past_from_are_the_validations_a_head_stays_there_from():
    rows = [
        _row(100, AT, PAST),
        _row(200, ABOVE, PAST),
        _row(300, AT, PAST),
        _row(400, ABOVE, PAST),
        _row(500, PAST, PAST),
    ]
    assert arms.first(rows, "MLM at [MASK]", (ABOVE, PAST))["step"] == "400"  # step 200's was lost again at 300
    assert arms.first(rows, "MLM at [MASK]", (PAST,))["step"] == "500"
    assert arms.first(rows, "NSP", (PAST,))["step"] == "100"
    assert arms.first(rows[:3], "MLM at [MASK]", (PAST,)) is None
    table = arms.summary_rows({"a": ["objective=bert"]}, {"a": rows})
    assert [r[2:5] for r in table] == [
        ["MLM at [MASK]", "400 (4.0e+11)", "500 (5.0e+11)"],
        ["NSP", "100 (1.0e+11)", "100 (1.0e+11)"],
    ]


def test_arms_train_at_once_and_report_when_each_head_left_its_baseline(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "argv", ["experiments/arms.py"])
    path = _file(
        tmp_path,
        "about: Two masking rates.\n"
        f"common: [{', '.join(SMALL)}, max_steps=4, val_every=2, trainer.enable_progress_bar=false, export=false]\n"
        "arms:\n  m15: [objective=roberta]\n  m30: [objective=roberta, objective.mask_rate=0.3]\n",
    )
    out = tmp_path / "out"
    assert arms.main([str(path), "--out", str(out), "--jobs", "2"]) == 0
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["columns"] == arms.COLUMNS and report["about"].startswith("Two masking rates.")
    assert [(r[0], r[2]) for r in report["rows"]] == [("m15", "MLM at [MASK]"), ("m30", "MLM at [MASK]")]
    assert all(r[5].startswith("4 (") for r in report["rows"])  # the last validation: step 4
    assert all(r[7] in (AT, ABOVE, PAST) and 0 < float(r[8]) < 1 for r in report["rows"])
    curves = (out / "report" / "curves.csv").read_text().splitlines()
    assert curves[0].startswith("arm,step,") and [c.split(",")[:2] for c in curves[1:]] == [
        ["m15", "2"],
        ["m15", "4"],
        ["m30", "2"],
        ["m30", "4"],
    ]
    assert json.loads((out / "report" / "provenance.json").read_text())["command"].startswith("python")
    # the same folder with other arms is refused: its runs would be mixed with another experiment's
    other = _file(tmp_path, path.read_text().replace("mask_rate=0.3", "mask_rate=0.4"), "other.yaml")
    with pytest.raises(SystemExit):
        arms.main([str(other), "--out", str(out)])
    # --report-only trains nothing and writes the same report from the runs there
    before = (out / "report" / "report.json").read_text()
    assert arms.main([str(path), "--out", str(out), "--report-only"]) == 0
    assert (out / "report" / "report.json").read_text() == before
    # the same command again trains none of the arms that finished
    curve = out / "runs" / "m15" / "learning.csv"
    stamp = curve.stat().st_mtime_ns
    with caplog.at_level("INFO", logger="pretrainlab"):
        assert arms.main([str(path), "--out", str(out), "--jobs", "2"]) == 0
    assert "arm m15: trained already" in caplog.text and "arm m30: trained already" in caplog.text
    assert curve.stat().st_mtime_ns == stamp and (out / "report" / "report.json").read_text() == before
