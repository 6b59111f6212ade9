"""Every sweep file is valid for W&B's sweep engine, and every run it generates, with its command
line built the way the W&B agent builds it, composes with Hydra. No W&B server is needed."""

import os
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf
from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

# the W&B sweep engine; `make install` adds it (pip install --no-deps sweeps==0.3.0)
from sweeps import RunState, next_runs, schema_violations_from_proposed_config
from tests.conftest import ROOT, compose_config

SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
FLOAT_LIKE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def generated_runs(cfg: dict, cap: int = 40) -> list:
    runs = []
    while len(runs) < min(cap, cfg.get("run_cap", cap)):
        proposed = next_runs(cfg, runs, validate=True)[0]
        if proposed is None:  # a grid is used up
            break
        proposed.state = RunState.finished
        proposed.summary_metrics = {cfg["metric"]["name"]: float(len(runs))}  # bayes needs a result
        runs.append(proposed)
    return runs


def agent_argv(cfg: dict, run, env: dict) -> list[str]:
    """As wandb_agent.Agent._command_run: ${envvar:...} macros, then the argument macros."""
    old = dict(os.environ)
    os.environ.update(env)
    try:
        command = create_sweep_command(list(cfg["command"]))
    finally:
        os.environ.clear()
        os.environ.update(old)
    values = create_sweep_command_args({"args": {k: {"value": v["value"]} for k, v in run.config.items()}})
    values.update(env=["/usr/bin/env"], interpreter=["python"], program=[cfg["program"]])
    argv = []
    for c in map(str, command):
        argv += (values.get(c[2:-1]) or []) if c.startswith("${") and c.endswith("}") else [c]
    return argv


def test_the_sweeps_directory_has_the_studies():
    assert {p.stem for p in SWEEPS} >= {"objectives", "lr", "masking", "electra", "glue"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_is_valid_and_every_generated_run_composes(path: Path, tmp_path):
    cfg = yaml.safe_load(path.read_text())  # PyYAML, as wandb reads it
    assert schema_violations_from_proposed_config(cfg) == []
    assert [str(c) for c in cfg["command"][:3]] == ["${env}", "${interpreter}", "${program}"]
    assert "${args_no_hyphens}" in cfg["command"]
    for name, spec in cfg["parameters"].items():  # 1e-4 would reach W&B as a string
        for v in [spec.get("value"), spec.get("min"), spec.get("max"), *spec.get("values", [])]:
            assert not (isinstance(v, str) and FLOAT_LIKE.match(v)), f"{name}: {v!r} is a string; write 1.0e-4"
    runs = generated_runs(cfg)
    if cfg["method"] == "grid":
        expected = 1
        for spec in cfg["parameters"].values():
            expected *= len(spec.get("values", [None]))
        assert len(runs) == expected
    else:
        assert len(runs) == min(40, cfg.get("run_cap", 40))
    config_name = {"train.py": "train", "finetune.py": "finetune"}[cfg["program"]]
    assert (ROOT / cfg["program"]).is_file()
    seen = set()
    for run in runs:
        argv = agent_argv(cfg, run, {"PRETRAINED": str(tmp_path / "run")})
        assert argv[:3] == ["/usr/bin/env", "python", cfg["program"]]
        composed = compose_config(config_name, *argv[3:])
        for key, spec in run.config.items():  # every swept value arrives where it was meant to
            got = OmegaConf.select(composed, key)
            if isinstance(got, DictConfig):  # a config group choice (objective=, task=, model=)
                chosen = OmegaConf.load(ROOT / "conf" / key / f"{spec['value']}.yaml")
                own = [k for k in chosen if k != "defaults" and f"{key}.{k}" not in run.config]
                assert {k: got[k] for k in own} == {k: chosen[k] for k in own}, key
            elif isinstance(spec["value"], str):
                assert got == spec["value"], (key, got, spec)
            else:
                assert float(got) == pytest.approx(float(spec["value"])), (key, got, spec)
        if config_name == "finetune":
            assert composed.pretrained == str(tmp_path / "run")
        seen.add(tuple(argv))
    assert len(seen) == len(runs)  # no two runs are the same command


def test_the_objective_sweep_compares_every_objective():
    """An objective added under conf/objective/ is in the comparison sweep, and its offline command."""
    cfg = yaml.safe_load((ROOT / "sweeps" / "objectives.yaml").read_text())
    options = sorted(p.stem for p in (ROOT / "conf" / "objective").glob("*.yaml"))
    assert sorted(cfg["parameters"]["objective"]["values"]) == options
    offline = next(
        line for line in (ROOT / "sweeps" / "objectives.yaml").read_text().splitlines() if "-m objective=" in line
    )
    assert sorted(offline.split("-m objective=")[1].split()[0].split(",")) == options
