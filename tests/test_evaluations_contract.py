"""The evaluation plugin contract (``evaluation.base``): every task of ``conf/task/`` is a class its
config names, keeps the contract, and is found by the study and the comparison through it alone; what
is not an evaluation is refused with the list of those there are."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pretrainlab.evaluation import base
from tests.conftest import ROOT, compose_config, run_command

TASKS = sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml"))


@pytest.mark.parametrize("name", TASKS)
def test_every_task_config_names_an_evaluation_that_keeps_the_contract(name):
    evaluation = base.get(name)
    assert isinstance(evaluation, base.Evaluation) and evaluation.name == name
    assert evaluation.display and evaluation.metrics and evaluation.headline in evaluation.metrics
    assert evaluation.family in base.FAMILIES and evaluation.group in base.groups()
    block = evaluation.data_block
    cfg = compose_config("finetune", f"task={name}", "pretrained=x", f"{block}.data_dir=/data/{name}")
    assert block in cfg, f"conf/finetune.yaml has no {block}: block for {name}'s data settings"
    made = base.of(cfg)
    assert made.name == name and made.data.name == block  # the composed config names the same evaluation
    assert made.data.data_dir == f"/data/{name}" and made.data.cache_dir == cfg.cache_dir
    assert made.max_seq_len == cfg.task.max_seq_len
    assert evaluation.score(dict.fromkeys(evaluation.metrics, 0.5)) == pytest.approx(50.0)
    assert all(evaluation.metric_label(m) for m in evaluation.metrics)
    assert evaluation.contradictions({"task": name, "metrics": dict.fromkeys(evaluation.metrics, 0.5)}) == []


def test_a_mistyped_task_or_study_entry_or_evaluation_class_is_refused_with_what_there_is(tmp_path):
    from pretrainlab.studies.work import study_tasks

    with pytest.raises(base.UnknownEvaluation, match="unknown evaluation task 'sqaud'; the tasks are: blimp, cola"):
        base.get("sqaud")
    cfg = compose_config("ablate", "evals=[glue,probez]")
    with pytest.raises(base.UnknownEvaluation, match="evals: 'probez' is not an evaluation; choose among .*probes"):
        study_tasks(cfg)
    assert study_tasks(compose_config("ablate", "evals=[blimp,squad]", "suite.glue_tasks=[rte]")) == ["blimp", "squad"]
    assert study_tasks(compose_config("ablate", "evals=[glue,probes]", "suite.glue_tasks=[sst2,rte]")) == [
        "sst2",
        "rte",
        "probe_ner",
        "probe_sst2",
    ]
    typo = OmegaConf.create({"_target_": "pretrainlab.evaluation.glue.GlueTsk", "name": "rte"})
    with pytest.raises(base.UnknownEvaluation, match=r"GlueTsk.* the evaluation classes are: .*GlueTask"):
        base.instantiate(typo, "conf/task/rte.yaml")
    not_one = OmegaConf.create({"_target_": "pathlib.Path", "name": "rte"})
    with pytest.raises(base.UnknownEvaluation, match="is not an evaluation"):
        base.instantiate(not_one, "conf/task/rte.yaml")
    with pytest.raises(base.UnknownEvaluation, match="names no evaluation class"):
        base.instantiate(OmegaConf.create({"name": "rte"}), "conf/task/rte.yaml")
    recipe = {
        "_target_": "pretrainlab.evaluation.glue.GlueTask",
        "name": "rte",
        "lr": 1e-5,
        "batch_size": 8,
        "epochs": 1,
    }
    with pytest.raises(base.UnknownEvaluation, match="rte.yaml: .*learning_rate"):  # not a key of its recipe
        base.instantiate(OmegaConf.create({**recipe, "learning_rate": 2e-5}), "conf/task/rte.yaml")


def test_a_studys_suite_under_its_old_name_glue_is_read_as_its_suite_with_a_warning(caplog):
    """``glue.tasks``, ``glue.seeds`` and ``glue.overrides``, the suite block's names before the suite was
    named for what it is, still work (from a command line, a user's config or an earlier slot's recorded
    settings): the warning names the new keys, and the study reads the same suite."""
    import logging
    import sys

    from pretrainlab.studies.work import study_tasks

    old = compose_config(
        "ablate", "glue.tasks=[rte,cola]", "glue.seeds=[3]", 'glue.overrides=["glue.source=synthetic"]'
    )
    new = compose_config(
        "ablate", "suite.glue_tasks=[rte,cola]", "suite.seeds=[3]", 'suite.overrides=["glue.source=synthetic"]'
    )
    with caplog.at_level(logging.WARNING, logger="pretrainlab"):
        assert study_tasks(new) == ["rte", "cola"]
        assert not caplog.records  # the new names: nothing to say
        assert study_tasks(old) == ["rte", "cola"]
    assert "glue.tasks, glue.seeds, glue.overrides" in caplog.text, caplog.text
    assert "suite.glue_tasks, suite.seeds, suite.overrides" in caplog.text
    assert OmegaConf.to_container(old) == OmegaConf.to_container(new)  # the old block is gone, its values moved
    recorded = OmegaConf.create(
        {"evals": ["glue", "blimp"], "glue": {"tasks": ["sst2"], "seeds": [0, 1], "overrides": []}}
    )
    assert study_tasks(recorded) == ["sst2", "blimp"] and list(recorded.suite.seeds) == [0, 1]
    # the one-encoder script and its config under their old names
    shown = run_command([sys.executable, "experiments/glue.py", "pretrained=x", "seeds=[4]", "--cfg", "job"], cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert "old name of experiments/suite.py" in shown.stderr and "seeds:\n- 4" in shown.stdout


def test_no_module_outside_an_evaluations_own_names_it():
    """The runner, the suite, the study, the comparison and the slot find evaluations through the
    contract: none of them names an evaluation's module or class, or asks what kind it is."""
    own = {"base.py", "run.py", "results.py", "__init__.py"}
    # the contract's own: data blocks, synthetic sets, the fine-tuning loop (one run, or several at once: fused)
    shared = {"data", "finetuning", "fused"}
    folder = ROOT / "src" / "pretrainlab" / "evaluation"
    modules = {p.stem for p in folder.glob("*.py")} | {
        p.name for p in folder.iterdir() if (p / "__init__.py").is_file()
    }
    modules -= {p[:-3] for p in own} | shared
    assert "glue" in modules and "probes" in modules
    callers = [
        *(ROOT / "src" / "pretrainlab" / d for d in ("studies", "compare", "slot")),
        *(ROOT / "src" / "pretrainlab" / "evaluation" / f for f in own),
    ]
    files = [p for c in callers for p in ([c] if c.is_file() else sorted(c.rglob("*.py")))]
    assert files
    for f in files:
        text = f.read_text()
        for module in modules:
            assert f"evaluation.{module}" not in text and f"evaluation import {module}" not in text, (f, module)
        assert not re.search(r'\.kind\s*[!=]=\s*"(glue|ner|blimp|probe|squad)"|task\.kind', text), f
    assert Path(ROOT / "src" / "pretrainlab" / "evaluation" / "tasks.py").exists() is False


def test_evaluations_read_no_config_after_they_are_made():
    """An evaluation gets its recipe and its data block when it is made (``base.of``); its work is given a
    ``RunContext``: nothing in an evaluation's own modules reads a composed config."""
    folder = ROOT / "src" / "pretrainlab" / "evaluation"
    own = [
        p for p in folder.rglob("*.py") if p.name not in ("base.py", "run.py", "results.py", "data.py", "finetuning.py")
    ]
    assert len(own) >= 10
    for f in own:
        text = f.read_text()
        assert not re.search(r"\bcfg\b|DictConfig", text), f"{f.relative_to(ROOT)} reads a config"


def test_an_evaluation_reads_the_data_block_it_was_made_with(tmp_path):
    cfg = compose_config("finetune", "task=rte", "pretrained=x", "glue.source=local", f"glue.data_dir={tmp_path}")
    evaluation = base.of(cfg)
    cfg.glue.data_dir = str(tmp_path / "elsewhere")  # the config changes after it was made: not read again
    assert evaluation.data.data_dir == str(tmp_path) and evaluation.data_files() == []
    with pytest.raises(base.ConfigError, match="made without its data settings"):
        base.get("rte").data_files()


def test_every_synthetic_set_is_one_base_and_every_family_is_declared():
    from pretrainlab.evaluation.blimp import SyntheticPairs
    from pretrainlab.evaluation.conll import SyntheticNer
    from pretrainlab.evaluation.data import SyntheticSet
    from pretrainlab.evaluation.glue.synthetic import SyntheticGlue
    from pretrainlab.evaluation.squad import SyntheticSquad
    from pretrainlab.runtime.rundir import RUN_OUTPUTS

    sets = [SyntheticGlue, SyntheticNer, SyntheticPairs, SyntheticSquad]
    assert all(issubclass(s, SyntheticSet) for s in sets)
    assert len({s.folder for s in sets}) == len(sets)  # one folder of the cache each
    assert SyntheticGlue(seed=1).key() != SyntheticGlue().key()
    # overwrite=true deletes what a run's suites wrote: every folder the contract says they write
    assert set(base.result_dirs()) <= set(RUN_OUTPUTS)
    with pytest.raises(TypeError, match="family"):
        type("Other", (base.Evaluation,), {"family": "other"})


def test_a_result_of_a_task_whose_class_was_renamed_keeps_its_settings(tmp_path):
    """probe_ner's results written when its class was ``probes.ProbeTask`` are results of the same settings:
    the class a task config names is code, not a setting; a setting that differs is still refused."""
    from pretrainlab.config import plain
    from pretrainlab.evaluation.results import ResultError, check_settings, settings_of

    now = plain(compose_config("finetune", "task=probe_ner", "pretrained=x"))
    old_task = {**now["task"], "_target_": "pretrainlab.evaluation.probes.ProbeTask"}
    old = {"task": "probe_ner", "config": {**now, "task": old_task}}
    check_settings(old, now, tmp_path / "seed0.json")
    assert settings_of(old) == settings_of({"task": "probe_ner", "config": now})
    other = {"task": "probe_ner", "config": {**now, "task": {**old_task, "lr": 1.0}}}
    with pytest.raises(ResultError, match="task.lr"):
        check_settings(other, now, tmp_path / "seed0.json")
