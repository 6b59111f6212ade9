"""Recipe arms: a study of pretraining only (``evals=[]``, the presets of ``conf/ablation/`` that ask a recipe
question), its arms and shared settings checked before any run, when a head left its baseline read off its
learning curve (``studies.recipe``), and a whole study on the CPU."""

import json
import sys

import pytest
from omegaconf import OmegaConf, open_dict

from pretrainlab.config import ConfigError
from pretrainlab.objectives.learning import ABOVE, AT, PAST
from pretrainlab.studies import recipe
from tests.conftest import ROOT, SMALL, compose_config, run_command

QUOTED = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731


def _study(tmp_path, *extra: str, steps: int = 4):
    pretrain = [*SMALL, f"max_steps={steps}", "val_every=2", "checkpoint_every=1000"]
    return compose_config(
        "ablate",
        "study=arms",
        f"output_root={tmp_path}",
        "evals=[]",
        "scratch=false",
        "intrinsic=false",
        f"pretrain={QUOTED(pretrain)}",
        *extra,
    )


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("arms", {}, "names no arm"),
        ("arms", {"a": "objective=bert"}, "arms.a: a list of train.py overrides"),
        ("arms", {"../up": ["objective=bert"]}, "cannot name an arm"),
        ("arms", {".": ["objective=bert"]}, "cannot name an arm"),
        ("arms", {"scratch": ["objective=bert"]}, "cannot name an arm"),
        ("arms", {"a": ["model=tiny"]}, "name the arm's objective once"),
        ("arms", {"a": ["objective=bertt"]}, "objective=bertt is not one of conf/objective/"),
        ("pretrain", "model=tiny", "pretrain: a list of train.py overrides"),
    ],
)
def test_arms_or_shared_settings_that_cannot_be_run_are_refused_naming_the_cause(tmp_path, key, value, says):
    from pretrainlab.studies.ablation import check_study

    cfg = _study(tmp_path)
    with open_dict(cfg):
        cfg[key] = value
    with pytest.raises(ConfigError, match="arms|pretrain") as e:
        check_study(cfg)
    assert says in str(e.value)
    assert not (tmp_path / "arms").exists()  # refused before anything was written


def test_two_arms_that_compose_the_same_run_or_an_unknown_override_or_a_bad_time_limit_are_refused(tmp_path):
    from pretrainlab.studies.ablation import check_study

    same = 'arms={a: ["objective=bert"], b: ["objective=bert", "model=tiny"]}'
    for extra, says in [
        ((same,), "arms a and b compose the same pretraining run"),
        (('arms={a: ["objective=bert", "objective.no_such_key=1"]}',), "no_such_key"),
        (("minutes=-1",), "give a positive, finite number of minutes"),
        (("minutes=inf",), "give a positive, finite number of minutes"),
        (("minutes=5", "evals=[glue]"), "stops a study of pretraining only"),
    ]:
        with pytest.raises(Exception, match=says):
            check_study(_study(tmp_path, *extra))
    assert not (tmp_path / "arms" / "pretrain").exists()  # refused before any run


def test_a_study_folder_that_is_a_file_or_holds_other_files_is_refused_and_left_as_it_was(tmp_path):
    """``<output_root>/<study>`` must be new or a study's own: a user's folder is never written into."""
    from pretrainlab.studies.ablation import run_study

    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "report.md").write_text("my own notes")
    (tmp_path / "afile").write_text("keep me")
    for study, says in [("mine", r"holds files a study did not make \(notes\)"), ("afile", "is a file")]:
        with pytest.raises(ConfigError, match=says):
            run_study(_study(tmp_path, f"study={study}", 'arms={a: ["objective=bert"], b: ["objective=roberta"]}'))
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["notes", "notes/report.md"]
    assert (mine / "notes" / "report.md").read_text() == "my own notes"
    assert (tmp_path / "afile").read_text() == "keep me"


def test_an_arm_name_too_long_for_a_wandb_tag_is_refused(tmp_path):
    from pretrainlab.studies.arms import study_arms

    name = "a" * 65
    cfg = _study(tmp_path)
    with open_dict(cfg):
        cfg.arms = {name: ["objective=bert"]}
        with pytest.raises(ConfigError, match="1 to 64 letters"):
            study_arms(cfg)
        cfg.arms = {name[:64]: ["objective=bert"]}
    assert list(study_arms(cfg)) == [name[:64]]


def test_ctrl_c_stops_the_study_with_the_command_that_continues_it(tmp_path, monkeypatch, caplog):
    import pretrainlab.studies.launch as launch
    from pretrainlab.studies.ablation import run_study

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run_parallel", interrupted)
    cfg = _study(tmp_path, 'arms={a: ["objective=bert"], b: ["objective=roberta"]}', "jobs=2")
    with pytest.raises(SystemExit) as stopped:
        run_study(cfg)
    assert stopped.value.code == 130
    assert "Ctrl-C: the study arms stopped (a run in training saved its checkpoint). Continue it with:" in caplog.text
    assert caplog.text.split("Continue it with:")[1].lstrip().startswith("python")  # this process's command
    # the old entry point of recipe arms runs nothing, and names the command that does
    old = run_command(
        [sys.executable, "experiments/arms.py", "experiments/arms/xlnet_lr.yaml", "--out", str(tmp_path / "o")],
        cwd=ROOT,
    )
    assert old.returncode == 2 and "python experiments/ablate.py +ablation=xlnet_lr" in old.stderr
    assert not (tmp_path / "o").exists()


def test_a_time_limit_stops_the_runs_and_the_report_says_what_they_validated(tmp_path, caplog):
    """``minutes``: when it runs out, every run still training is stopped (each saves its checkpoint) and the
    study reports what they validated, instead of ending without a report."""
    from pretrainlab.studies.ablation import run_study

    cfg = _study(
        tmp_path, 'arms={a: ["objective=bert"], b: ["objective=roberta"]}', "jobs=2", "minutes=0.4", steps=100000
    )
    with caplog.at_level("WARNING", logger="pretrainlab"):
        table = run_study(cfg)
    assert "minutes=0.4 ran out" in caplog.text and table["tasks"] == []
    rows = json.loads((tmp_path / "arms" / "report" / "report.json").read_text())["rows"]
    assert sorted({r[0] for r in rows}) == ["a-s0", "b-s0"]
    for run in ("a-s0", "b-s0"):  # stopped, not finished: a checkpoint to continue from, no encoder yet
        assert (tmp_path / "arms" / "pretrain" / run / "checkpoints" / "last.ckpt").is_file()
        assert not (tmp_path / "arms" / "pretrain" / run / "encoder").exists()


def test_deadlines_nest_each_raising_its_own_and_the_outer_goes_on_after_the_inner():
    """An inner deadline (a study's ``minutes``) inside an outer one (a GPU slot's time): whichever comes
    first is raised as its own, and leaving the inner one re-arms the outer for what is left of its time."""
    import time

    from pretrainlab.runtime.signals import TimeUp, deadline

    now, said = time.time(), []
    with pytest.raises(TimeUp) as up:  # the outer first: raised inside the inner one, as the outer's
        with deadline(now + 0.2, lambda: said.append("outer") or "outer") as outer:
            try:
                with deadline(now + 30, lambda: "inner"):
                    time.sleep(5)
            finally:
                time.sleep(0.3)  # a slow clean-up (processes stopped) is not stopped by the same time again
    assert str(up.value) == "outer" and up.value.limit is outer and said == ["outer"] and time.time() - now < 2
    now = time.time()
    with pytest.raises(TimeUp) as up:
        with deadline(now + 0.6, lambda: "outer") as outer:
            with pytest.raises(TimeUp) as inner_up:
                with deadline(now + 0.1, lambda: "inner") as inner:
                    time.sleep(5)
            assert inner_up.value.limit is inner and str(inner_up.value) == "inner"
            time.sleep(5)  # the outer deadline is armed again: it stops this
    assert up.value.limit is outer and 0.5 < time.time() - now < 2


def test_a_slots_time_running_out_during_a_studys_runs_stops_the_study_not_only_its_runs(tmp_path):
    """The study's own ``minutes`` are caught and reported; an enclosing command's time (a GPU slot's
    deadline) running out while the study's runs train goes on up and stops the study (it once was taken
    for the study's own, and the slot went on to report runs that had not started)."""
    import time

    import pretrainlab.studies.launch as launch
    from pretrainlab.runtime.signals import TimeUp, deadline
    from pretrainlab.studies.ablation import run_study

    slot = None

    def training(*args, **kwargs):  # the slot's time runs out while the runs train
        raise TimeUp("the slot's time", slot)

    cfg = _study(tmp_path, 'arms={a: ["objective=bert"], b: ["objective=roberta"]}', "jobs=2")
    for extra in ({}, {"minutes": 5}):  # processes at once, with or without a time limit of the study's own
        with open_dict(cfg):
            cfg.update(extra)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(launch, "run_parallel", training)
            with pytest.raises(TimeUp, match="the slot's time") as up:
                with deadline(time.time() + 600, lambda: "the slot's time") as slot:
                    run_study(cfg)
        assert up.value.limit is slot and not (tmp_path / "arms" / "report").exists()


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
    assert recipe.first(rows, "MLM at [MASK]", (ABOVE, PAST))["step"] == "400"  # step 200's was lost again at 300
    assert recipe.first(rows, "MLM at [MASK]", (PAST,))["step"] == "500"
    assert recipe.first(rows, "NSP", (PAST,))["step"] == "100"
    assert recipe.first(rows[:3], "MLM at [MASK]", (PAST,)) is None
    table = recipe.summary_rows({"a-s0": ["objective=bert"]}, {"a-s0": rows})
    assert [r[:5] for r in table] == [
        ["a-s0", "objective=bert", "MLM at [MASK]", "400 (4.0e+11)", "500 (5.0e+11)"],
        ["a-s0", "objective=bert", "NSP", "100 (1.0e+11)", "100 (1.0e+11)"],
    ]


def test_arms_train_at_once_and_report_when_each_head_left_its_baseline(tmp_path, monkeypatch, caplog):
    """Two arms of a study of pretraining only, trained at once: the report (report.json, curves.csv: what
    the docs publish) says when each head left its baseline; the same command again trains nothing and
    writes the same report; the same folder with other arms is refused, naming the run that differs."""
    from pretrainlab.studies.ablation import run_study

    monkeypatch.setattr(sys, "argv", ["experiments/ablate.py"])
    arms = 'arms={m15: ["objective=roberta"], m30: ["objective=roberta", "objective.mask_rate=0.3"]}'
    about = "about='Two masking rates.'"
    table = run_study(_study(tmp_path, arms, about, "jobs=2"))
    report = tmp_path / "arms" / "report"
    assert table["tasks"] == [] and sorted(table["learning"]) == ["m15-s0", "m30-s0"]
    made = json.loads((report / "report.json").read_text())
    assert made["columns"] == recipe.COLUMNS and made["about"].startswith("Two masking rates.")
    assert [(r[0], r[1], r[2]) for r in made["rows"]] == [
        ("m15-s0", "objective=roberta", "MLM at [MASK]"),
        ("m30-s0", "objective=roberta objective.mask_rate=0.3", "MLM at [MASK]"),
    ]
    assert all(r[5].startswith("4 (") for r in made["rows"])  # the last validation: step 4
    assert all(r[7] in (AT, ABOVE, PAST) and 0 < float(r[8]) < 1 for r in made["rows"])
    curves = (report / "curves.csv").read_text().splitlines()
    assert curves[0].startswith("arm,step,") and [c.split(",")[:2] for c in curves[1:]] == [
        ["m15-s0", "2"],
        ["m15-s0", "4"],
        ["m30-s0", "2"],
        ["m30-s0", "4"],
    ]
    assert json.loads((report / "provenance.json").read_text())["command"].startswith("python")
    assert not list((tmp_path / "arms").rglob("seed*.json"))  # nothing was fine-tuned
    # the same folder with other arms: its runs would be mixed with another experiment's
    from pretrainlab.runtime.provenance import SettingsMismatch

    with pytest.raises(SettingsMismatch, match="m30-s0 holds an encoder pretrained with other settings"):
        run_study(_study(tmp_path, arms.replace("mask_rate=0.3", "mask_rate=0.4"), about, "jobs=2"))
    # the same command again trains none of the runs that finished, and writes the same report
    before = (report / "report.json").read_text()
    curve = tmp_path / "arms" / "pretrain" / "m15-s0" / "learning.csv"
    stamp = curve.stat().st_mtime_ns
    with caplog.at_level("INFO", logger="pretrainlab"):
        run_study(_study(tmp_path, arms, about, "jobs=2"))
    # both arms, each by its name (both are roberta's)
    assert all(caplog.text.count(f"pretraining {arm} seed 0: done already") == 1 for arm in ("m15", "m30")), caplog.text
    assert curve.stat().st_mtime_ns == stamp
    assert json.loads((report / "report.json").read_text())["rows"] == json.loads(before)["rows"]


def test_the_recipe_presets_are_studies_of_pretraining_only_that_compose(tmp_path):
    """Each recipe preset of conf/ablation/ (what experiments/arms/*.yaml were) composes into a study that
    evaluates nothing and whose arms all train on the data its corpus names, or, for a preset that names
    none (electra_escape), on the synthetic language."""
    from pretrainlab.studies.work import pretraining_runs, study_rows

    recipes = [p.stem for p in sorted((ROOT / "conf" / "ablation").glob("*.yaml")) if "evals: []" in p.read_text()]
    assert {"bert_pair_loss", "slot_recipe", "xlnet_collapse", "xlnet_lr"} <= set(recipes)
    assert "electra_escape" in recipes
    for name in recipes:
        own_corpus = "corpus:" in (ROOT / "conf" / "ablation" / f"{name}.yaml").read_text()
        cfg = compose_config(
            "ablate", f"+ablation={name}", f"output_root={tmp_path}", *(["corpus=/data/c"] if own_corpus else [])
        )
        assert OmegaConf.select(cfg, "about") and list(cfg.evals) == []
        root, arms, fractions = study_rows(cfg)
        runs = pretraining_runs(cfg, root, arms, fractions)
        assert len(runs) == len(arms) >= 2
        for _, train_cfg, _, _ in runs:
            if own_corpus:
                assert "/data/c" in str(train_cfg.data.get("path") or list(train_cfg.data.get("files") or []))
            else:
                assert train_cfg.data._target_.endswith("SyntheticCorpus"), (name, train_cfg.data)
