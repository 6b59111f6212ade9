"""The evaluation plugin contract (``evaluation.base``): every task of ``conf/task/`` is a class its
config names, keeps the contract, and is found by the study and the comparison through it alone; what
is not an evaluation is refused with the list of those there are."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pretrainlab.evaluation import base
from tests.conftest import ROOT, compose_config

TASKS = sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml"))


@pytest.mark.parametrize("name", TASKS)
def test_every_task_config_names_an_evaluation_that_keeps_the_contract(name):
    evaluation = base.get(name)
    assert isinstance(evaluation, base.Evaluation) and evaluation.name == name
    assert evaluation.display and evaluation.metrics and evaluation.headline in evaluation.metrics
    assert evaluation.family in ("glue", "eval") and evaluation.group in base.groups()
    cfg = compose_config("finetune", f"task={name}", "pretrained=x", "glue.source=synthetic")
    assert evaluation.data in cfg, f"conf/finetune.yaml has no {evaluation.data}: block for {name}'s data settings"
    assert base.of(cfg).name == name  # the composed config names the same evaluation
    assert evaluation.score(dict.fromkeys(evaluation.metrics, 0.5)) == pytest.approx(50.0)
    assert all(evaluation.metric_label(m) for m in evaluation.metrics)
    assert evaluation.contradictions({"task": name, "metrics": dict.fromkeys(evaluation.metrics, 0.5)}) == []


def test_a_mistyped_task_or_study_entry_or_evaluation_class_is_refused_with_what_there_is(tmp_path):
    from pretrainlab.studies.ablation import study_tasks

    with pytest.raises(base.UnknownEvaluation, match="unknown evaluation task 'sqaud'; the tasks are: blimp, cola"):
        base.get("sqaud")
    cfg = compose_config("ablate", "evals=[glue,probez]")
    with pytest.raises(base.UnknownEvaluation, match="evals: 'probez' is not an evaluation; choose among .*probes"):
        study_tasks(cfg)
    assert study_tasks(compose_config("ablate", "evals=[blimp,squad]", "glue.tasks=[rte]")) == ["blimp", "squad"]
    assert study_tasks(compose_config("ablate", "evals=[glue,probes]", "glue.tasks=[sst2,rte]")) == [
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


def test_no_module_outside_an_evaluations_own_names_it():
    """The runner, the suite, the study, the comparison and the slot find evaluations through the
    contract: none of them names an evaluation's module or class, or asks what kind it is."""
    own = {"base.py", "run.py", "results.py", "__init__.py"}
    modules = {p.stem for p in (ROOT / "src" / "pretrainlab" / "evaluation").glob("*.py")} - {p[:-3] for p in own}
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
