"""Every option of every config group composes and instantiates; new options are picked up
by globbing conf/, so nobody has to remember to add them here."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from pretrainlab.model.encoder import EncoderConfig
from pretrainlab.objectives.base import Objective
from pretrainlab.pretraining.assembly import build_objective
from pretrainlab.tokens import SpecialTokens
from tests.conftest import CONF, ROOT, compose_config, compose_train, run_command

# options that need a value the user must give
REQUIRED = {("tokenizer", "pretrained"): ["tokenizer.path=tokenizer.json"], ("data", "packed"): ["data.path=pack"]}
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("experiment",))
OPTIONS = [(g, y.stem) for g in GROUPS for y in sorted((CONF / g).glob("*.yaml"))]


def test_groups_are_found():
    assert {"model", "objective", "data", "tokenizer", "optim", "trainer", "logger"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option, tmp_path):
    if group == "task":  # evaluation tasks belong to conf/finetune.yaml
        from pretrainlab.evaluation.base import get
        from pretrainlab.runtime.settings import check_finetuning

        cfg = compose_config("finetune", f"task={option}", "pretrained=x")
        task = get(cfg.task.name)
        assert task.name == option and cfg.task.max_seq_len > 0
        check_finetuning(cfg)
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves (the optimizer's too)
        if task.fine_tuned or task.seeded:  # what trains (the encoder, or probes) has a recipe
            assert cfg.task.lr > 0 and cfg.task.batch_size > 0 and cfg.task.epochs > 0
        return
    if group == "ablation":  # a published ablation's arms, on top of a study (conf/ablate*.yaml)
        from pretrainlab.studies.arms import arm_changes, study_arms

        for study in ("ablate", "ablate_quick", "ablate_slot"):
            cfg = compose_config(study, f"+ablation={option}")
            arms = study_arms(cfg)
            assert len(arms) >= 2 and cfg.baseline in arms and cfg.study == option.replace("_", "-")
            assert all(changed for changed in arm_changes(cfg, list(arms), cfg.baseline).values())
        return
    cfg = compose_train(f"{group}={option}", *REQUIRED.get((group, option), []))
    node = cfg[group]
    if group == "objective":
        tokens = SpecialTokens(100, 0, 1, 2, 3, 4, np.zeros(100, dtype=bool))
        encoder_config = EncoderConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2)
        obj = build_objective(cfg, encoder_config, tokens)
        assert isinstance(obj, Objective) and obj.name == option
    elif group == "model":
        assert isinstance(instantiate(node, vocab_size=node.vocab_size or 100), EncoderConfig)
    elif group == "logger":
        assert not node or instantiate(node, save_dir=str(tmp_path)) is not None  # logger=none: {}
    elif group == "trainer":
        # a GPU preset is checked on this machine's CPU: every other key must still be a valid Trainer argument
        late = {"accelerator": "cpu"} if node.get("accelerator") == "gpu" and not torch.cuda.is_available() else {}
        assert instantiate(node, logger=False, **late) is not None
    else:
        assert instantiate(node) is not None


PRIMARY = sorted(y.stem for y in CONF.glob("*.yaml"))


@pytest.mark.parametrize("name", PRIMARY)
def test_every_entry_point_config_composes(name):
    cfg = compose_config(name)
    assert cfg is not None and len(cfg) > 0
    assert set(PRIMARY) >= {"train", "finetune", "suite", "ablate", "ablate_quick"}


def test_unknown_choice_lists_the_valid_ones():
    out = run_command([sys.executable, "train.py", "objective=nope"], cwd=ROOT)
    assert out.returncode != 0
    assert "Could not find 'objective/nope'" in out.stderr and "roberta" in out.stderr


EXPERIMENTS = sorted(y.stem for y in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_paper_presets_compose_and_build(name):
    cfg = compose_train(f"experiment={name}")
    assert cfg.objective.name in name and cfg.max_steps >= 100_000 and cfg.batch_size >= 128
    encoder_config = instantiate(cfg.model, vocab_size=cfg.tokenizer.vocab_size)
    tokens = SpecialTokens(cfg.tokenizer.vocab_size, 0, 1, 2, 3, 4, np.zeros(cfg.tokenizer.vocab_size, dtype=bool))
    with torch.device("meta"):
        obj = build_objective(cfg, encoder_config, tokens)
    assert obj.name == cfg.objective.name
    assert cfg.max_seq_len <= encoder_config.max_position_embeddings


def test_every_example_in_the_entry_points_docstrings_composes():
    """The commands shown at the top of train.py, finetune.py and experiments/*.py compose as written."""
    import ast
    import re
    import shlex

    scripts = {
        "train.py": "train",
        "finetune.py": "finetune",
        "experiments/ablate.py": "ablate",
        "experiments/suite.py": "suite",
    }
    checked = 0
    for script, default in scripts.items():
        doc = ast.get_docstring(ast.parse((ROOT / script).read_text()))
        text = doc.replace("\\\n", " ")
        for line in text.splitlines():
            line = re.sub(r"<[^>]*>", "x", line.split("#")[0]).strip()  # placeholders: runs/<run>
            if not line.startswith(f"python {script}"):
                continue
            args = shlex.split(line)[2:]
            name = default
            if "--config-name" in args:
                i = args.index("--config-name")
                name = args[i + 1]
                del args[i : i + 2]
            args = [a for a in args if a != "-m"]
            if "-m" in shlex.split(line):  # multirun sweeps: compose the first value of each list
                args = [a.split(",")[0] if "=" in a and "[" not in a else a for a in args]
            if name in ("finetune", "suite") and not any(a.startswith("pretrained=") for a in args):
                args.append("pretrained=x")
            if name == "ablate_local":
                args += ["corpus=x", "glue_dir=y"]
            compose_config(name, *args)
            checked += 1
    assert checked >= 6


def test_the_gpu_check_scripts_train_command_composes():
    """experiments/gpu_check.sh runs on GPU machines only: its train.py overrides are checked here."""
    import re
    import shlex

    text = (ROOT / "experiments" / "gpu_check.sh").read_text().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if '"$PY" train.py' in line]
    assert len(commands) == 1
    args = shlex.split(commands[0].split("train.py", 1)[1].split(">")[0])
    args = [re.sub(r"\$compile", "false", a) for a in args if not a.startswith("hydra.")]
    cfg = compose_config("train", *args)
    assert cfg.batch_size == 256 and cfg.trainer.accelerator == "gpu" and cfg.logger.name == "csv"


def test_the_gpu_check_script_never_writes_over_an_earlier_measurement(tmp_path):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "bench_eager.txt").write_text("numbers")
    done = subprocess.run(
        ["bash", str(ROOT / "experiments" / "gpu_check.sh"), str(earlier)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "already holds files" in done.stderr
    assert [p.name for p in earlier.iterdir()] == ["bench_eager.txt"]
    assert (earlier / "bench_eager.txt").read_text() == "numbers"


def test_help_lists_the_groups_each_entry_point_composes():
    train = run_command([sys.executable, "train.py", "--help"], cwd=ROOT, timeout=120)
    assert train.returncode == 0, train.stderr
    groups = {line.split(":")[0] for line in train.stdout.splitlines() if ": " in line and "," in line}
    assert {"model", "objective", "data", "tokenizer", "trainer", "logger"} <= groups and "task" not in groups
    assert "model: albert_base, base, electra_small, large, medium, mini, small, tiny" in train.stdout
    finetune = run_command([sys.executable, "finetune.py", "--help"], cwd=ROOT, timeout=120)
    assert finetune.returncode == 0 and "task: blimp, cola," in finetune.stdout


def test_the_one_gpu_recipe_plans_every_run_on_the_gpu_at_its_budget(tmp_path):
    """conf/ablate_gpu.yaml runs on GPU machines only: every pretraining run it plans composes on one
    GPU in bf16 at its FLOPs budget, each masked LM sees the ~4B tokens its docs state, and every
    evaluation fine-tunes on all training examples on the GPU."""
    from pretrainlab.studies.work import pretraining_runs, study_tasks

    cfg = compose_config("ablate_gpu", "corpus=books", "glue_dir=glue", f"output_root={tmp_path}")
    objectives = ["bert", "albert", "roberta", "electra"]
    planned = pretraining_runs(cfg, tmp_path / cfg.study, objectives, [0.0625, 0.25])
    assert len(planned) == 4 * 3 and not any(done for *_, done in planned)
    for _, train_cfg, _, _ in planned:
        assert train_cfg.trainer.accelerator == "gpu" and train_cfg.trainer.precision == "bf16-mixed"
        assert train_cfg.budget.flops == 1e17 and train_cfg.batch_size == 256 and train_cfg.data.files == ["books"]
        assert list(train_cfg.snapshots) == [0.0625, 0.25]
        vocab = train_cfg.tokenizer.vocab_size
        encoder_config = instantiate(train_cfg.model, vocab_size=vocab)
        assert (encoder_config.hidden_size, encoder_config.num_layers) == (256, 4)
        tokens = SpecialTokens(vocab, 0, 1, 2, 3, 4, np.zeros(vocab, dtype=bool))
        with torch.device("meta"):
            obj = build_objective(train_cfg, encoder_config, tokens)
        budget_tokens = train_cfg.budget.flops / obj.flops_per_token(encoder_config, train_cfg.max_seq_len)
        assert (3.0e9 < budget_tokens < 3.6e9) if obj.name == "electra" else (4.0e9 < budget_tokens < 4.4e9)
    assert study_tasks(cfg) == ["cola", "sst2", "mrpc", "stsb", "rte", "ner", "blimp", "probe_ner", "probe_sst2"]
    suite = compose_config("suite", "pretrained=x", *cfg.suite.overrides)
    assert suite.glue.max_train_examples is None and suite.trainer.accelerator == "gpu"


def test_the_cpu_study_plans_the_masked_lms_with_three_seeds_at_the_budget_its_docs_state(tmp_path):
    """conf/ablate_cpu.yaml: three masked LMs x three seeds, bf16 on the CPU, each to 1.7e14 FLOPs; the
    tokens its comment states follow from the objectives' own FLOPs per token."""
    from pretrainlab.studies.work import pretraining_runs, study_tasks

    cfg = compose_config("ablate_cpu", "corpus=books", "glue_dir=glue", f"output_root={tmp_path}")
    planned = pretraining_runs(cfg, tmp_path / cfg.study, list(cfg.objectives), [])
    assert sorted(p[0].name for p in planned) == sorted(
        f"{o}-s{s}" for o in ("bert", "albert", "roberta") for s in (0, 1, 2)
    )
    for _, train_cfg, _, _ in planned:
        assert train_cfg.trainer.accelerator == "auto" and train_cfg.trainer.precision == "bf16-mixed"
        assert train_cfg.budget.flops == 1.7e14 and train_cfg.batch_size == 32 and train_cfg.data.files == ["books"]
        assert train_cfg.tokenizer.vocab_size == 8192 and not train_cfg.snapshots
        encoder_config = instantiate(train_cfg.model, vocab_size=8192)
        assert (encoder_config.hidden_size, encoder_config.num_layers) == (128, 2)
        tokens = SpecialTokens(8192, 0, 1, 2, 3, 4, np.zeros(8192, dtype=bool))
        with torch.device("meta"):
            obj = build_objective(train_cfg, encoder_config, tokens)
        budget_tokens = train_cfg.budget.flops / obj.flops_per_token(encoder_config, train_cfg.max_seq_len)
        assert 60e6 < budget_tokens < 65e6, (obj.name, budget_tokens)
    assert study_tasks(cfg) == ["cola", "sst2", "mrpc", "stsb", "rte", "blimp", "probe_ner", "probe_sst2"]
    assert cfg.baseline == "bert" and "electra" not in cfg.objectives


@pytest.mark.parametrize("name", PRIMARY)
def test_every_top_level_key_can_be_set_from_the_command_line(name):
    """Hydra reads `key=value` as a config-group choice when conf/<key>/ exists: a plain value named after
    a group the config does not choose (ablate_local's `model` once) cannot be set from the command line
    (a block such as finetune's `optim` can: `optim.lr=...`)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(name, return_hydra_config=True)
    chosen = set(cfg.hydra.runtime.choices)
    clashing = [
        k for k in cfg if k != "hydra" and (CONF / k).is_dir() and k not in chosen and not OmegaConf.is_dict(cfg[k])
    ]
    assert not clashing, f"conf/{name}.yaml: {clashing} cannot be overridden as key=value (conf/{clashing[0]}/ exists)"
