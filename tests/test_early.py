"""W&B imported before torch by the commands whose runs log there (``runtime.early``): its first run in a
process then costs a few tenths of a second instead of seconds (``experiments/bench_startup.py --wandb``
measures it; no test times it)."""

import ast
import subprocess
import sys

import pytest

from pretrainlab.runtime.early import chooses_wandb, logs_to_wandb
from tests.conftest import ROOT

WANDB = {"_target_": "pretrainlab.runtime.wandb_runs.WandbLogger", "mode": "offline"}


def _fresh(code: str) -> str:
    """What a new interpreter prints after ``code`` (this one has torch loaded already)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.parametrize(
    "logger, imports",
    [
        (WANDB, True),
        ({**WANDB, "mode": "disabled"}, False),
        ({"_target_": "lightning.pytorch.loggers.CSVLogger"}, False),
        (None, False),
        (True, True),  # a study whose runs log to W&B (chooses_wandb)
        (False, False),
    ],
)
def test_wandb_is_imported_first_only_for_a_logger_that_logs_there(logger, imports):
    said = _fresh(
        "import sys; from pretrainlab.runtime.early import import_wandb_first; "
        f"print(import_wandb_first({logger!r}), 'wandb.apis.public' in sys.modules, 'torch' in sys.modules)"
    )
    assert said == f"{imports} {imports} False"  # never torch: the point is to come before it


def test_after_torch_it_is_too_late_and_nothing_is_imported():
    said = _fresh(
        "import sys, torch; from pretrainlab.runtime.early import import_wandb_first; "
        f"print(import_wandb_first({WANDB!r}), 'wandb' in sys.modules)"
    )
    assert said == "False False"


def test_a_study_chooses_wandb_unless_every_list_of_overrides_picks_another_logger():
    assert chooses_wandb(["model=tiny"], None)  # the default logger
    assert chooses_wandb(["logger=csv"], ["glue.source=synthetic"])  # the suite's runs log to W&B
    assert not chooses_wandb(["logger=csv"], ["logger=csv"])
    assert chooses_wandb(["logger=csv", "logger=wandb"], ["logger=csv"])  # the last choice wins
    assert not chooses_wandb(["+logger=none"], ["logger=csv"])
    assert logs_to_wandb(WANDB) and not logs_to_wandb({})


@pytest.mark.parametrize("script", ["train.py", "experiments/suite.py", "experiments/ablate.py"])
def test_each_command_imports_wandb_first_before_anything_that_loads_torch(script):
    """In each command's ``main``: the call to import_wandb_first comes before the first import of the
    package's modules beyond ``runtime.early`` (those load torch)."""
    main = next(
        node
        for node in ast.walk(ast.parse((ROOT / script).read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "main"
    )
    order = []
    for node in main.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pretrainlab"):
            order.append("early" if node.module == "pretrainlab.runtime.early" else f"import {node.module}")
        elif any(isinstance(n, ast.Name) and n.id == "import_wandb_first" for n in ast.walk(node)):
            order.append("import_wandb_first")
    assert order[:2] == ["early", "import_wandb_first"] and len(order) > 2, order
