"""A whole ablation study from one command, offline, at a small compute budget: two objectives
pretrained to the same FLOPs with two seeds each, snapshots at half the budget, the GLUE suite on
each encoder, snapshot and on scratch, the report with intervals, differences and the compute
curve; then resumed."""

import json
import sys

import pytest
import yaml

from tests.conftest import ROOT, SMALL, compose_config, run_command


@pytest.mark.slow
def test_ablation_study_end_to_end_and_resumable(tmp_path, monkeypatch):
    from pretrainlab.studies.ablation import run_study

    pretrain = [*SMALL, "data.num_documents=200", "budget.flops=1.5e11", "checkpoint_every=1000", "val_every=1000"]
    glue = [
        "glue.source=synthetic",
        "glue.synthetic.scale=0.1",
        "task_overrides.epochs=1",
        "task_overrides.lr=3.0e-4",
        "task_overrides.max_seq_len=64",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    overrides = [
        "study=small",
        f"output_root={tmp_path}",
        "objectives=[roberta,electra]",
        "seeds=[0,1]",
        f"pretrain={quoted(pretrain)}",
        "suite.glue_tasks=[rte,cola]",
        "suite.seeds=[0]",
        "snapshots=[0.5]",
        "baseline=roberta",
        f"suite.overrides={quoted(glue)}",
        # ELECTRA at a learning rate too small to learn anything in this budget: its runs are the
        # ones the report must name as not yet learned
        f"+objective_overrides.electra={quoted(['optim.lr=1.0e-6'])}",
    ]
    table = run_study(compose_config("ablate", *overrides))

    root = tmp_path / "small"
    assert table["labels"] == ["electra", "roberta", "scratch"] and table["tasks"] == ["cola", "rte"]
    for name in ("comparison.md", "comparison.csv", "comparison.png", "comparison.json", "curve.png", "curve.csv"):
        assert (root / "report" / name).is_file()
    # the curve: a point at half the budget and one at the end for each objective, FLOPs rising
    for objective in ("roberta", "electra"):
        points = table["curve"][objective]
        assert [p["fraction"] for p in points] == [0.5, 1.0], points
        assert points[0]["flops"] < points[1]["flops"] and 0.45 < points[0]["flops"] / points[1]["flops"] < 0.6
        assert points[1]["glue"] == pytest.approx(table["glue"][objective]["score"][0])
        # an interval wherever the two encoders' scores differ (tiny encoders may tie at the majority class)
        assert all(p["encoders"] == 2 and (p["ci"] is None or p["ci"][0] <= p["glue"] <= p["ci"][1]) for p in points)
        snap = root / "pretrain" / f"{objective}-s1" / "snapshots" / "0.5" / "glue" / "rte" / "seed0.json"
        assert json.loads(snap.read_text())["pretrained"]["fraction"] == 0.5
    assert "scratch" not in table["curve"]
    intrinsic = json.loads((root / "report" / "intrinsic.json").read_text())["runs"]
    assert sorted(intrinsic) == ["electra-s0", "electra-s1", "roberta-s0", "roberta-s1"]
    assert 0 < intrinsic["roberta-s0"]["own"]["mlm_acc"] < 1 and "rtd_acc" in intrinsic["electra-s0"]["own"]
    # intervals over the two pretraining seeds, and electra against the baseline
    glue = table["glue"]["electra"]["summary"]
    assert glue["encoders"] == 2 and glue["sd_pt"] is not None
    assert glue["ci"] is None if glue["sd_pt"] == 0 else glue["ci"][0] <= glue["mean"] <= glue["ci"][1]
    diff = table["differences"]["electra"]["glue"]
    assert (
        diff["test"] == "paired t over encoders" and diff["pairs"] == 2 and (diff["p"] is None or 0 <= diff["p"] <= 1)
    )
    assert diff["mean"] == pytest.approx(table["glue"]["electra"]["score"][0] - table["glue"]["roberta"]["score"][0])
    assert "Difference against roberta" in (root / "report" / "comparison.md").read_text()
    # ELECTRA's discriminators, barely trained, find no replacement: those runs are named before the
    # table, and every run's heads are in learning.md
    learned = json.loads((root / "report" / "learning.json").read_text())
    assert sorted(learned) == ["electra-s0", "electra-s1", "roberta-s0", "roberta-s1"] == sorted(table["learning"])
    status = {(run, c["head"]): c["status"] for run, row in learned.items() for c in row["checks"]}
    assert (
        status[("electra-s0", "replaced-token detection")]
        == status[("electra-s1", "replaced-token detection")]
        == "at baseline"
        != status[("roberta-s0", "MLM at [MASK]")]
    )
    md = (root / "report" / "comparison.md").read_text()
    assert md.startswith("**Not yet learned: 2 of 4 pretraining runs") and "- electra-s1: replaced-token" in md
    assert "| roberta-s1 | MLM at [MASK] |" in (root / "report" / "learning.md").read_text()
    flops = {}
    for objective in ("roberta", "electra"):
        meta = json.loads((root / "pretrain" / f"{objective}-s0" / "encoder" / "config.json").read_text())
        flops[objective] = meta["pretraining"]["flops"]
        result = json.loads((root / "pretrain" / f"{objective}-s0" / "glue" / "rte" / "seed0.json").read_text())
        assert result["label"] == objective and result["pretrained"]["objective"] == objective
    assert all(1.5e11 <= f < 1.5e11 * 1.2 for f in flops.values()), flops  # the same budget for both
    # what it cost: every run's recorded training seconds, and every results file's runtime once
    # (4 encoders x 2 tasks, their 4 snapshots, scratch's 2)
    cost = json.loads((root / "report" / "cost.json").read_text())
    recorded = {
        r: json.loads((root / "pretrain" / r / "encoder" / "config.json").read_text())["pretraining"]["seconds"]
        for r in ("electra-s0", "electra-s1", "roberta-s0", "roberta-s1")
    }
    assert {r["run"]: r["seconds"] for r in cost["pretraining"]} == recorded and all(s > 0 for s in recorded.values())
    runtimes = [json.loads(p.read_text())["runtime_s"] for p in (root / "pretrain").rglob("seed0.json")]
    assert {t: e["runs"] for t, e in cost["evaluation"].items()} == {"cola": 9, "rte": 9} and len(runtimes) == 18
    assert cost["evaluation_s"] == pytest.approx(sum(runtimes))
    assert cost["total_s"] == pytest.approx(sum(recorded.values()) + sum(runtimes))
    assert "| roberta-s1 |" in (root / "report" / "cost.md").read_text()
    # and the code that made them: one version for all four, named by its commit in a git checkout
    code = {json.dumps(r["software"], sort_keys=True) for r in cost["pretraining"]}
    assert (
        len(code) == 1 and "Every encoder was pretrained with pretrainlab" in (root / "report" / "cost.md").read_text()
    )
    # and how the report was made, for the docs that cite it (tools/docs.py)
    made = json.loads((root / "report" / "provenance.json").read_text())
    assert made["command"].startswith("python ") and made["date"].endswith("UTC") and made["device"]
    assert made["software"]["torch"] and made["commit"] == made["software"]["commit"]
    assert (root / "pretrain" / "roberta-s0" / "glue-scratch" / "cola" / "seed0.json").is_file()
    # both pretraining seeds of each objective are in its row: the spread over them is reported
    for objective in ("roberta", "electra"):
        assert sorted(e["pretrain_seed"] for e in table["encoders"][objective]) == [0, 1]
        scores = [
            100
            * json.loads((root / "pretrain" / f"{objective}-s{s}" / "glue" / "rte" / "seed0.json").read_text())[
                "metrics"
            ]["accuracy"]
            for s in (0, 1)
        ]
        cell = table["cells"][objective]["rte"]
        assert cell["score"][0] == pytest.approx(sum(scores) / 2) and cell["encoders"] == 2
        assert cell["pretrain_sd"]["score"] == pytest.approx(abs(scores[0] - scores[1]) / 2**0.5)

    def fail(*a, **k):
        raise AssertionError("finished work was redone")

    monkeypatch.setattr("pretrainlab.pretraining.run.run", fail)
    monkeypatch.setattr("pretrainlab.evaluation.run.run", fail)
    again = run_study(compose_config("ablate", *overrides))
    assert json.loads(json.dumps(again)) == json.loads((root / "report" / "comparison.json").read_text())


def test_a_study_with_no_evaluations_pretrains_and_reports_what_each_run_learned(tmp_path):
    """``evals=[]``: a study of pretraining only. Its runs train and its report says what each learned
    (learning.md, learning-curves.md, the cost); nothing is fine-tuned (no suite's folder, no comparison),
    though the study's suite settings would evaluate on data there is."""
    from pretrainlab.studies.ablation import run_study

    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    pretrain = [*SMALL, "max_steps=20", "val_every=10", "checkpoint_every=20"]
    table = run_study(
        compose_config(
            "ablate",
            "study=p",
            f"output_root={tmp_path}",
            "objectives=[roberta]",
            "evals=[]",
            f"pretrain={quoted(pretrain)}",
            "suite.glue_tasks=[rte]",
            f"suite.overrides={quoted(['glue.source=synthetic', 'glue.synthetic.scale=0.05', 'logger=csv'])}",
        )
    )
    root = tmp_path / "p"
    assert table["tasks"] == [] and list(table["learning"]) == ["roberta-s0"]
    assert (root / "pretrain" / "roberta-s0" / "encoder" / "encoder.safetensors").is_file()
    assert not [p for p in (root / "pretrain" / "roberta-s0").iterdir() if p.name.startswith(("glue", "eval"))]
    made = {p.name for p in (root / "report").iterdir()}
    assert {"learning.md", "learning-curves.md", "cost.md", "provenance.json"} <= made, made
    assert not [name for name in made if name.startswith("comparison")], made


@pytest.mark.slow
def test_the_quick_study_shows_what_pretraining_buys(tmp_path):
    """conf/ablate_quick.yaml as shipped, with one objective: RoBERTa against the same encoder from
    scratch on the study's three GLUE tasks (dev sets of words the tasks' training sets never show), three
    fine-tuning seeds each, the synthetic minimal pairs and the frozen-feature probes. Pretraining must be
    ahead on most GLUE tasks, and by a large, significant margin where the label is the topic of words
    known from pretraining alone (SST-2); zero-shot, the objective must tell grammatical from
    ungrammatical sentences where the scratch encoder guesses, and its frozen features must carry the
    entity types of words the probe never saw. Its time is the shipped study's (one objective of it):
    1,000 pretraining steps, then 2 x 9 fine-tunings, BLiMP and the probes for the encoder and scratch;
    scaled down, it would no longer test what ships."""
    from pretrainlab.studies.ablation import run_study

    table = run_study(
        compose_config("ablate_quick", f"output_root={tmp_path}", "objectives=[roberta]", "intrinsic=false")
    )
    tasks = table["tasks"]
    assert tasks == ["cola", "sst2", "mrpc", "blimp", "probe_ner", "probe_sst2"]
    diffs = {task: table["differences"]["roberta"][task] for task in tasks}
    ahead = [task for task in ("cola", "sst2", "mrpc") if diffs[task]["mean"] > 0]
    assert len(ahead) >= 2, diffs
    assert diffs["sst2"]["significant"] and diffs["sst2"]["mean"] > 30, diffs["sst2"]
    cells = table["cells"]
    assert cells["roberta"]["sst2"]["score"][0] > 90 > cells["scratch"]["sst2"]["no_skill"] + 30
    assert cells["scratch"]["sst2"]["score"][0] < 70  # scratch knows nothing of the dev set's words
    assert table["glue"]["roberta"]["score"][0] > table["glue"]["scratch"]["score"][0] + 15
    blimp = {label: cells[label]["blimp"]["summary"]["mean"] for label in ("roberta", "scratch")}
    assert blimp["roberta"] > 90 and 35 < blimp["scratch"] < 65, blimp
    assert diffs["blimp"]["test"] == "McNemar (exact) over items" and diffs["blimp"]["p"] < 1e-6, diffs["blimp"]
    assert diffs["probe_ner"]["significant"] and diffs["probe_ner"]["mean"] > 40, diffs["probe_ner"]
    # the masked LM is past its trivial baseline on held-out text, and the report opens with no warning
    assert [c["status"] for c in table["learning"]["roberta-s0"]["checks"]] == ["past baseline"]
    assert (tmp_path / "quick" / "report" / "comparison.md").read_text().startswith("| encoder")


@pytest.mark.slow
def test_a_study_reports_every_evaluation_with_intervals_and_tests(tmp_path):
    """evals=[glue, ner, blimp, probes]: every encoder (and scratch) on each, one report with a column
    per task, BLiMP by field with intervals over pairs, the probes layer by layer, and the differences
    against the baseline with the test each evaluation calls for."""
    from pretrainlab.studies.ablation import run_study

    pretrain = [*SMALL, "max_steps=200", "val_every=200", "checkpoint_every=200"]
    glue = [
        "glue.source=synthetic",
        "glue.synthetic.scale=0.2",
        "blimp.source=synthetic",
        "blimp.synthetic.pairs=200",
        "ner.source=synthetic",
        "ner.synthetic.scale=0.3",
        "task_overrides.epochs=2",
        "task_overrides.lr=1.0e-3",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    table = run_study(
        compose_config(
            "ablate",
            "study=evals",
            f"output_root={tmp_path}",
            "objectives=[roberta]",
            "seeds=[0]",
            "intrinsic=false",
            "evals=[glue,ner,blimp,probes]",
            "suite.glue_tasks=[sst2]",
            "suite.seeds=[0,1]",
            "baseline=scratch",
            f"pretrain={quoted(pretrain)}",
            f"suite.overrides={quoted(glue)}",
        )
    )
    report = tmp_path / "evals" / "report"
    assert table["tasks"] == ["sst2", "ner", "blimp", "probe_ner", "probe_sst2"]
    assert table["labels"] == ["roberta", "scratch"]
    md = (report / "comparison.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| encoder"))
    assert header.split(" | ")[1:4] == ["SST-2 (acc)", "GLUE", "NER (F1)"] and "BLiMP (acc)" in header
    assert "BLiMP by field" in md and "NER probe: frozen-feature probes" in md
    blimp = table["cells"]["roberta"]["blimp"]["summary"]
    assert blimp["ci"][0] < blimp["mean"] < blimp["ci"][1] and blimp["ci"][1] - blimp["ci"][0] < 10
    diff = table["differences"]["roberta"]
    assert (
        diff["blimp"]["test"] == "McNemar (exact) over items"
        and diff["blimp"]["mean"] > 10
        and diff["blimp"]["p"] < 1e-3
    )
    assert diff["ner"]["test"] == "paired t over seeds" and diff["probe_ner"]["pairs"] == 2
    for name in ("blimp.md", "probes.md", "probes.png", "comparison.png"):
        assert (report / name).is_file()
    assert "| verb_object_order | 200 |" in (report / "blimp.md").read_text()
    run = tmp_path / "evals" / "pretrain" / "roberta-s0"
    assert (run / "eval" / "blimp" / "seed0.json").is_file() and (run / "eval-scratch" / "ner" / "seed1.json").is_file()
    assert (run / "glue" / "sst2" / "seed1.json").is_file()


def _arms_study(tmp_path, *extra):
    pretrain = [*SMALL, "data.num_documents=200", "max_steps=40", "checkpoint_every=1000", "val_every=1000"]
    glue = ["glue.source=synthetic", "glue.synthetic.scale=0.1", "task_overrides.epochs=1", "task_overrides.max_seq_len=64",
            "logger=csv", "trainer.enable_progress_bar=false"]  # fmt: skip
    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    return compose_config(
        "ablate",
        "study=arms",
        f"output_root={tmp_path}",
        f"pretrain={quoted(pretrain)}",
        "suite.glue_tasks=[rte]",
        "suite.seeds=[0,1]",
        f"suite.overrides={quoted(glue)}",
        "intrinsic=false",
        *extra,
    )


@pytest.mark.slow
def test_a_study_of_arms_pretrains_reports_and_tests_each_arm_by_its_name(tmp_path):
    """Two arms of one objective (RoBERTa's MLM at 15% and at 40% masking): a run directory, a row and a
    paired test per arm, named by the arm (both encoders record the objective roberta), and what the
    arm changed beside the baseline arm opening comparison.md. The objective's own overrides apply to
    every arm of it, before the arm's."""
    from pretrainlab.studies.ablation import run_study

    cfg = _arms_study(
        tmp_path,
        'arms={mlm: ["objective=roberta"], mlm-m40: ["objective=roberta", "objective.mask_rate=0.4"]}',
        '+objective_overrides.roberta=["objective.mask_token_prob=0.9"]',
        "baseline=mlm",
    )
    table = run_study(cfg)
    root = tmp_path / "arms"
    assert sorted(p.name for p in (root / "pretrain").iterdir()) == ["mlm-m40-s0", "mlm-s0"]
    made = {a: yaml.safe_load((root / "pretrain" / f"{a}-s0" / "config.yaml").read_text()) for a in ("mlm", "mlm-m40")}
    assert made["mlm"]["objective"]["mask_rate"] == 0.15 and made["mlm-m40"]["objective"]["mask_rate"] == 0.4
    assert made["mlm"]["objective"]["mask_token_prob"] == made["mlm-m40"]["objective"]["mask_token_prob"] == 0.9
    assert table["labels"] == ["mlm", "mlm-m40", "scratch"]
    assert list(table["differences"]) == ["mlm-m40", "scratch"] and table["differences"]["mlm-m40"]["rte"]["pairs"] == 2
    md = (root / "report" / "comparison.md").read_text()
    assert "Arms: what each changes beside mlm" in md and "- **mlm-m40**: objective.mask_rate: 0.15 -> 0.4" in md
    assert "Difference against mlm" in md
    # the arm is recorded in each encoder's export: any comparison of these results (compare.py) rows them by arm
    from pretrainlab.compare import collect, encoder_of

    assert {encoder_of(r)["label"] for r in collect([str(root / "pretrain")])} == {"mlm", "mlm-m40", "scratch"}


@pytest.mark.parametrize(
    "arms, says",
    [
        (
            '{a: ["objective=roberta"], b: ["objective=roberta", "objective.mask_rate=0.15"]}',
            "arms a and b compose the same pretraining run",
        ),
        # settings the study owns: an arm's seed once trained pretrain/a-s0 with seed 3
        ('{a: ["objective=roberta", "seed=3"]}', "arms.a: 'seed=3' sets seed, which the study owns"),
        ('{a: ["objective=roberta", "budget.flops=1e12"]}', "arms.a: 'budget.flops=1e12' sets budget.flops"),
        ('{a: ["objective=roberta", "hydra.run.dir=x"]}', "the study decides where every run's files go"),
        ("{}", "arms={} names no arm"),
        ("{" + "a" * 65 + ': ["objective=roberta"]}', "cannot name an arm: its runs are folders"),
        ('{../x: ["objective=roberta"]}', "'../x' cannot name an arm"),
        ('{scratch: ["objective=roberta"]}', "'scratch' cannot name an arm"),
        ('{a: ["objective.mask_rate=0.4"]}', "arms.a: name the arm's objective once"),
        ('{a: ["objective=robrta"]}', "arms.a: objective=robrta is not one of conf/objective/"),
        ('{a: "objective=roberta"}', "arms.a: a list of train.py overrides"),
    ],
)
def test_arms_that_cannot_make_a_comparison_are_refused_before_any_work(tmp_path, arms, says):
    from pretrainlab.config import ConfigError
    from pretrainlab.studies.ablation import check_study

    with pytest.raises(ConfigError) as refused:
        check_study(_arms_study(tmp_path, f"arms={arms}"))
    assert says in str(refused.value)
    assert not (tmp_path / "arms").exists()


def test_a_seed_for_every_run_is_refused_and_rows_given_twice_on_the_command_line_too(tmp_path):
    """``pretrain=[seed=3]`` would train every run with seed 3 under the name of the study's seeds; and
    ``objectives=`` beside ``arms=`` (or ``+ablation=``) once ran the arms and ignored the objectives."""
    from pretrainlab.config import ConfigError
    from pretrainlab.studies.ablation import check_study
    from pretrainlab.studies.arms import check_arm_names

    cfg = _arms_study(tmp_path, "objectives=[roberta]")
    cfg.pretrain = [*cfg.pretrain, "seed=3"]
    with pytest.raises(ConfigError, match="pretrain: 'seed=3' sets seed, which the study owns.*seeds=\\[...\\]"):
        check_study(cfg)
    for rows in ('arms={a: ["objective=roberta"]}', "+ablation=mask_rate"):
        with pytest.raises(ConfigError, match="objectives=... and .* both name the study's rows"):
            check_arm_names(["objectives=[bert]", rows])
        check_arm_names([rows])  # alone, either is the rows
    assert not (tmp_path / "arms").exists()


def test_an_arm_named_twice_on_the_command_line_is_refused(tmp_path):
    """Hydra's grammar keeps the last of two keys of one name without a word: the study's entry points
    refuse it (a config file's YAML refuses it itself)."""
    arms = 'arms={a: ["objective=roberta"], b: ["objective=bert"], a: ["objective=electra"]}'
    done = run_command(
        [sys.executable, str(ROOT / "experiments" / "ablate.py"), f"output_root={tmp_path}", arms], timeout=300
    )
    assert done.returncode != 0 and "arms: a named twice in" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "objectives" / "pretrain").exists()  # (Hydra's own logs/ folder is made before any check)


def test_a_baseline_that_is_not_an_arm_is_refused(tmp_path):
    from pretrainlab.config import ConfigError
    from pretrainlab.studies.ablation import check_study

    cfg = _arms_study(tmp_path, 'arms={mlm: ["objective=roberta"]}', "baseline=roberta")
    with pytest.raises(ConfigError, match="baseline='roberta' is not a row of this study: name one of mlm, scratch"):
        check_study(cfg)


def test_an_arms_runs_are_named_and_tagged_by_the_arm_in_wandb(tmp_path):
    """Two arms of one objective logged to one W&B group: each run named and tagged by its arm (they
    would otherwise both be <objective>-<model>-s<seed>); a study of objectives keeps the default names."""
    from pretrainlab.studies.arms import pretraining_config

    arms = 'arms={m15: ["objective=roberta"], m30: ["objective=roberta", "objective.mask_rate=0.3"]}'
    cfg = _arms_study(tmp_path, arms, 'pretrain=["logger=wandb"]')
    m30, _ = pretraining_config(cfg, "m30", 1)
    assert (m30.logger.name, list(m30.logger.tags), m30.logger.group) == ("m30-s1", ["m30"], "arms")
    plain, _ = pretraining_config(
        _arms_study(tmp_path, "objectives=[roberta]", 'pretrain=["logger=wandb"]'), "roberta", 1
    )
    assert plain.logger.name is None and list(plain.logger.tags) == []


def test_an_arm_of_another_objective_names_the_objective_and_its_own_settings(tmp_path):
    """RoBERTa Table 2's rows beside BERT's SEGMENT-PAIR: DOC-SENTENCES is RoBERTa with blocks kept in
    one document, a setting BERT does not have; the report says so rather than only 'bert -> roberta'."""
    from pretrainlab.studies.arms import arm_changes

    cfg = _arms_study(tmp_path, "+ablation=input_format")
    changes = arm_changes(cfg, ["sentence-pair", "full-sentences", "doc-sentences"], "segment-pair")
    assert changes == {
        "sentence-pair": [("objective.pair_unit", "segments", "sentences")],
        "full-sentences": [("objective", "bert", "roberta")],
        "doc-sentences": [("objective", "bert", "roberta"), ("objective.cross_documents", True, False)],
    }


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml")))
def test_each_published_ablation_preset_runs_scaled_down(tmp_path, preset):
    """conf/ablation/<preset>.yaml on top of a study (here the offline one, scaled down, one pretraining
    seed: a question preset's three are the slot's): its arms pretrain, its report rows are the arms,
    each tested against the preset's baseline arm with what it changes named."""
    from omegaconf import OmegaConf

    from pretrainlab.studies.ablation import run_study
    from pretrainlab.studies.arms import study_arms

    cfg = _arms_study(tmp_path, f"+ablation={preset}", "suite.seeds=[0]", "seeds=[0]", "jobs=1")
    OmegaConf.set_struct(cfg, False)
    cfg.pretrain = [o if not o.startswith("max_steps=") else "max_steps=20" for o in cfg.pretrain]
    arms = list(study_arms(cfg))
    assert len(arms) >= 2 and cfg.baseline in arms
    if list(cfg.evals) == []:  # a recipe question: two of its arms (every arm composes: tests/test_arms.py)
        arms = [cfg.baseline, next(a for a in arms if a != cfg.baseline)]
        cfg.arms = {a: cfg.arms[a] for a in arms}
    table = run_study(cfg)
    if list(cfg.evals) == []:  # a recipe question: a study of pretraining only, its report when each head learned
        rows = json.loads((tmp_path / cfg.study / "report" / "report.json").read_text())["rows"]
        assert sorted({r[0] for r in rows}) == sorted(f"{a}-s0" for a in arms) and table["tasks"] == []
        return
    assert sorted(table["labels"]) == sorted([*arms, "scratch"])
    assert sorted(table["differences"]) == sorted([a for a in arms if a != cfg.baseline] + ["scratch"])
    md = (tmp_path / cfg.study / "report" / "comparison.md").read_text()
    assert f"Arms: what each changes beside {cfg.baseline}" in md
    assert "nothing" not in md.split("Arms:")[1].split("\n\n")[0]  # every arm changes something


def test_a_data_folder_the_study_would_ignore_is_refused_naming_the_config_file_not_the_study(tmp_path):
    """The refusal said `--config-name quick` (the study's name) for a study composed from ablate_quick."""
    blimp = tmp_path / "blimp"
    blimp.mkdir()
    done = run_command(
        [sys.executable, str(ROOT / "experiments" / "ablate.py"), "--config-name", "ablate_quick",
         f"output_root={tmp_path}", f"data_dirs.blimp={blimp}"],
        timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "synthetic in the suite.overrides of conf/ablate_quick.yaml): the folder would be ignored" in done.stderr, (
        done.stderr[-2000:]
    )
    assert "--config-name quick" not in done.stderr
