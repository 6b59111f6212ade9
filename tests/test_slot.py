"""The whole study in one GPU slot (``pretrainlab.slot``), scaled down to run here: the plan that turns
a time budget into one FLOP budget, the inputs archive, and the command end to end on generated data
in the layout of the real data (pack, run two slots, bring back, merge, report)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from pretrainlab.slot.calibrate import throughput
from pretrainlab.slot.plan import Rate, finish_times, largest_budget, round_down
from tests.conftest import ROOT, run_command

# the slot scaled down: two objectives of the tiny model, one GLUE task and seed, few pairs, short windows
SMALL = [
    "model_size=tiny",
    "vocab_size=1000",
    "batch_size=16",
    "precision=32-true",
    "compile=false",  # on a GPU too: a compile per process would take the scaled-down slot's whole window
    "objectives=[roberta,bert]",
    "suite.glue_tasks=[sst2]",
    "suite.seeds=[0]",
    "slot.reserve_s.evaluation=40",  # two encoders at once, then scratch, on a busy CPU
    "slot.reserve_s.report=5",
    "slot.startup_s=2",
    "slot.finish_s=2",
    "slot.calibration.warmup_steps=5",
    "slot.calibration.together_s=3",
    "slot.calibration.alone_s=1",
]


SST2 = [("roberta-s0", ""), ("bert-nsp0-s0", ""), ("roberta-s0", "-scratch")]  # the slot's sst2 results


# --- the plan ---------------------------------------------------------------------------------------------
def test_jobs_share_the_device_until_one_finishes_then_the_others_speed_up():
    rates = {"fast": Rate(together=1.0, alone=2.0), "slow": Rate(together=0.5, alone=1.0)}
    # both at once until "fast" has its 60 (60 s; "slow" has 30 of 60), then "slow" alone at 1.0 for 30 s
    assert finish_times(60.0, rates) == pytest.approx({"fast": 60.0, "slow": 90.0})
    assert finish_times(60.0, rates, startup_s=10, finish_s=5) == pytest.approx({"fast": 75.0, "slow": 105.0})
    # a job measured only among the others keeps that rate throughout: a conservative plan
    assert finish_times(60.0, {"fast": Rate(1.0), "slow": Rate(0.5)}) == pytest.approx({"fast": 60.0, "slow": 120.0})
    three = Rate(together=1.0, alone=3.0)
    assert three.at(3, 3) == pytest.approx(1.0) and three.at(1, 3) == pytest.approx(3.0)
    assert three.at(2, 3) == pytest.approx(1 / (1 / 3 + 0.5 * (1 - 1 / 3)))  # time per FLOP halfway between


def test_the_plan_is_the_largest_equal_budget_that_ends_in_its_window():
    rates = {"fast": Rate(together=1.0, alone=2.0), "slow": Rate(together=0.5, alone=1.0)}
    plan = largest_budget(rates, window_s=100.0, safety=1.0, digits=3)
    assert plan.budget_flops == pytest.approx(66.6)  # the makespan is 1.5 x the budget: 66.67 rounded down
    assert plan.makespan_s <= 100.0 < max(finish_times(plan.budget_flops * 1.02, rates).values())
    assert largest_budget(rates, 100.0, safety=0.5, digits=3).budget_flops == pytest.approx(33.3)
    assert round_down(1.2345e16) == 1.2e16 and round_down(9.99e15, 1) == 9e15
    with pytest.raises(ValueError, match="leaves no time to train"):
        largest_budget(rates, window_s=20.0, startup_s=15.0, finish_s=10.0)


def test_throughput_at_once_is_compared_with_the_same_jobs_one_after_another():
    window = {"seconds": 10.0}
    measured = {
        "a": {
            "flops_per_token": 2.0,
            "together": {**window, "tokens": 50.0, "flops": 100.0},
            "alone": {"seconds": 1.0, "flops": 20.0, "tokens": 10.0},
        },
        "b": {
            "flops_per_token": 4.0,
            "together": {**window, "tokens": 25.0, "flops": 100.0},
            "alone": {"seconds": 1.0, "flops": 40.0, "tokens": 10.0},
        },
    }
    speed = throughput(measured, budget_flops=40.0)
    assert speed["together"] == pytest.approx({"tokens_per_s": 7.5, "flops_per_s": 20.0})
    # one after another: a alone 40/20 = 2 s, b alone 40/40 = 1 s; 80 FLOPs (20 + 10 tokens) in 3 s
    assert speed["one_after_another"] == pytest.approx({"tokens_per_s": 10.0, "flops_per_s": 80.0 / 3})
    assert speed["speedup"] == pytest.approx(20.0 / (80.0 / 3))


def test_a_slot_of_several_seeds_times_every_run_at_once_and_each_arm_alone_once(tmp_path):
    """With several pretraining seeds, calibration has a job per run (roberta-s1), times them all at once,
    and alone only each arm's first seed: the windows skip the others, which take its time alone."""
    from pretrainlab.slot.run import alone_as_first, calibration_jobs
    from pretrainlab.studies.throughput import Windows

    assert calibration_jobs(["mlm", "electra"], [0]) == {"mlm": "mlm", "electra": "electra"}
    first = calibration_jobs(["mlm", "electra"], [0, 1, 2])
    assert list(first)[:3] == ["mlm-s0", "electra-s0", "mlm-s1"] and first["electra-s2"] == "electra-s0"
    names = {f"calibrating {job}": job for job in first}
    for job in first:
        (tmp_path / f"ready-{job}.json").write_text("{}")
    windows = Windows(tmp_path, names, together_s=5.0, alone_s=2.0, alone=set(first.values()))
    windows(list(names))
    written = json.loads((tmp_path / "windows.json").read_text())
    assert sorted(written["alone"]) == ["electra-s0", "mlm-s0"]  # two turns alone, not six
    window = {"seconds": 10.0, "tokens": 50.0, "flops": 100.0}
    measured = {job: {"flops_per_token": 2.0, "together": window} for job in first}
    measured["mlm-s0"]["alone"] = {"seconds": 1.0, "tokens": 10.0, "flops": 20.0}
    measured["electra-s0"]["alone"] = {"seconds": 1.0, "tokens": 5.0, "flops": 10.0}
    timed = alone_as_first(measured, first)
    assert timed["mlm-s2"]["alone"] == measured["mlm-s0"]["alone"] and timed["mlm-s2"]["alone_from"] == "mlm-s0"
    assert "alone_from" not in timed["mlm-s0"] and "alone" not in measured["mlm-s2"]  # the measurement kept
    assert throughput(timed)["jobs"] == 6 and "one_after_another" in throughput(timed)
    from pretrainlab.slot.report import slot_markdown

    rates = {job: {"together": 2e12, "alone": 3e12 if job.startswith("mlm") else 4e12} for job in first}
    md = slot_markdown({"seeds": [0, 1, 2], "plan": {"budget_flops": 1e15, "rates": rates}})
    assert "| mlm-s1 | 2.00 | 3.00 |" in md and "| electra-s2 | 2.00 | 4.00 |" in md  # a row per run, once
    assert md.count("| mlm-s1 |") == 1 and "mlm-s1-s" not in md


# --- the inputs ---------------------------------------------------------------------------------------------
def shared_layout(root: Path) -> Path:
    """Generated data in the layout of ../shared/data: corpus/<name>/*.txt, glue/, blimp/, conll2003/."""
    from pretrainlab.data.synthetic import SyntheticLanguage, generate_documents
    from pretrainlab.evaluation.blimp import SyntheticPairs
    from pretrainlab.evaluation.conll import SyntheticNer
    from pretrainlab.evaluation.glue.synthetic import SyntheticGlue

    corpus = root / "corpus" / "synthetic"
    corpus.mkdir(parents=True)
    for i, text in enumerate(generate_documents(300, 8, 20, SyntheticLanguage(seed=0))):
        (corpus / f"doc{i:04d}.txt").write_text(text + "\n")
    generated = root / ".generated"
    shutil.copytree(SyntheticGlue(scale=0.05).write(generated), root / "glue")
    shutil.copytree(SyntheticPairs(pairs=30).write(generated), root / "blimp")
    shutil.copytree(SyntheticNer(scale=0.1).write(generated), root / "conll2003")
    shutil.rmtree(generated)
    return root


@pytest.fixture
def packed(once):
    """The scaled-down study's inputs, packed once per session: (data root, archive), read-only."""
    from pretrainlab.slot.__main__ import main

    def make(home: Path) -> None:
        (home / "data").mkdir()
        root = shared_layout(home / "data")
        argv = ["pack", "--data", str(root), "--corpus", str(root / "corpus" / "synthetic"), "--out"]
        assert main([*argv, str(home / "inputs.tar.xz"), *SMALL]) == 0

    home = once("test_slot-inputs", make)
    return home / "data", home / "inputs.tar.xz"


def test_the_inputs_hold_the_corpus_tokenized_and_the_evaluation_files_as_they_were(packed, tmp_path):
    from pretrainlab.data.hashing import file_digest
    from pretrainlab.slot.inputs import InputsError, pack, unpack
    from pretrainlab.slot.run import compose_study

    root, archive = packed
    inputs, manifest = unpack(archive, tmp_path / "work")
    assert (inputs / "corpus" / "tokens.npy").is_file() and manifest["corpus"]["documents"] == 300
    assert manifest["corpus"]["tokenizer"]["vocab_size"] == 1000
    # each evaluation's files, by its data block, as they were where they came from
    for rel, source in (
        ("glue/SST-2/train.tsv", "glue/SST-2/train.tsv"),
        ("glue/SST-2/dev.tsv", "glue/SST-2/dev.tsv"),
        ("ner/train.txt", "conll2003/train.txt"),
        ("blimp/verb_object_order.jsonl", "blimp/verb_object_order.jsonl"),
    ):
        assert file_digest(inputs / rel) == file_digest(root / source) == manifest["files"][rel], rel
    assert not (inputs / "glue" / "CoLA").exists()  # only what the study reads (SST-2 for GLUE and the probe)

    # unpacked again into the same place: checked, and a damaged file is found
    (inputs / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n")
    with pytest.raises(InputsError, match="dev.tsv is missing or differs from the file packed"):
        unpack(archive, tmp_path / "work")

    cfg = compose_study(Path("inputs"), [0], tmp_path, SMALL)
    dirs = {"glue": root / "glue", "blimp": root / "blimp", "ner": root / "conll2003"}
    with pytest.raises(InputsError, match="exists: pack into a new file"):
        pack(cfg, archive, root / "corpus" / "synthetic", dirs)
    too_big = tmp_path / "big.tar.xz"
    with pytest.raises(InputsError, match=r"take 0\.\d*[1-9]\d* MiB compressed, more than the 0.001 MiB allowed"):
        pack(cfg, too_big, root / "corpus" / "synthetic", dirs, 0.001)  # not "0.0 MiB ... more than 0.001"
    assert not too_big.exists()
    # every file the study's evaluations read, or the pack is refused naming what is missing
    no_dev = tmp_path / "glue-no-dev"
    shutil.copytree(root / "glue", no_dev)
    (no_dev / "SST-2" / "dev.tsv").unlink()
    with pytest.raises(InputsError, match=r"SST-2 lacks dev.tsv: sst2 reads train.tsv, dev.tsv"):
        pack(cfg, tmp_path / "x.tar.xz", root / "corpus" / "synthetic", {**dirs, "glue": no_dev})
    shutil.rmtree(no_dev / "SST-2")
    with pytest.raises(InputsError, match="sst2: no data file of it in .*glue-no-dev"):
        pack(cfg, tmp_path / "x.tar.xz", root / "corpus" / "synthetic", {**dirs, "glue": no_dev})
    with pytest.raises(InputsError, match="--data-dir glue=.*nowhere: no such folder"):
        pack(cfg, tmp_path / "x.tar.xz", root / "corpus" / "synthetic", {**dirs, "glue": tmp_path / "nowhere"})
    assert not (tmp_path / "x.tar.xz").exists()

    # a file the manifest does not list is refused on unpacking: the study would score it
    extra = inputs / "blimp" / "an_extra_paradigm.jsonl"
    shutil.copy(root / "blimp" / "verb_object_order.jsonl", extra)
    shutil.copy(root / "glue" / "SST-2" / "dev.tsv", inputs / "glue" / "SST-2" / "dev.tsv")  # the damaged one, repaired
    with pytest.raises(InputsError, match="1 file.s. that inputs.json does not list .blimp/an_extra_paradigm.jsonl"):
        unpack(archive, tmp_path / "work")
    extra.unlink()
    assert unpack(archive, tmp_path / "work")[1] == manifest

    with pytest.raises(InputsError, match="probe_ner read ner data.*--data-dir ner=<folder>"):
        pack(
            cfg, tmp_path / "x.tar.xz", root / "corpus" / "synthetic", {"glue": root / "glue", "blimp": root / "blimp"}
        )


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--minutes", "-5", "give the whole command's time in minutes, a finite number above 0"),
        ("--minutes", "0", "a finite number above 0"),
        ("--budget-flops", "-1", "give pretraining FLOPs per objective"),
        ("--budget-flops", "nan", "a finite number above 0"),
        ("--budget-flops", "lots", "'lots' is not a number"),
    ],
)
def test_a_slots_time_and_budget_are_checked_where_they_are_given(tmp_path, capsys, option, value, says):
    from pretrainlab.slot.__main__ import main

    argv = ["run", "--inputs", str(tmp_path / "in.tar.xz"), "--out", str(tmp_path / "out"), "--seed", "0"]
    with pytest.raises(SystemExit) as e:
        main([*argv, option, value])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["pack", "--corpus", str(tmp_path), "--out", str(tmp_path / "x.tar.xz"), "--max-mib", "0"])
    assert "--max-mib: 0: give the largest archive in MiB" in capsys.readouterr().err


def test_a_slots_overrides_may_stand_between_its_options(capsys):
    """``run ... +ablation=electra_vs_mlm --rates-from X slot.reserve_s.evaluation=100`` (as docs/slot.md
    writes it) was refused as "unrecognized arguments": argparse takes one run of positionals only."""
    from pretrainlab.slot.__main__ import parse

    argv = ["run", "--inputs", "i.tar.xz", "--out", "o", "+ablation=electra_vs_mlm", "--rates-from", "r.json"]
    args = parse([*argv, "slot.reserve_s.evaluation=100", "--minutes", "9.3", "lr=1e-3"])
    assert args.overrides == ["+ablation=electra_vs_mlm", "slot.reserve_s.evaluation=100", "lr=1e-3"]
    assert str(args.rates_from) == "r.json" and args.minutes == 9.3
    for bad, says in (
        (["--bogus", "3"], "unrecognized arguments: --bogus 3"),
        (["stray"], "unrecognized arguments: stray"),
    ):
        with pytest.raises(SystemExit):
            parse([*argv, *bad])
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):  # merge takes no overrides
        parse(["merge", "a.tar.gz", "--out", "m", "lr=1e-3"])
    assert "unrecognized arguments: lr=1e-3" in capsys.readouterr().err


def test_the_entry_point_installs_nothing_when_nothing_is_missing_and_names_what_it_cannot_install(tmp_path):
    code = f"""
import importlib.util, json, sys
sys.argv = ["experiments/slot.py", "run"]
spec = importlib.util.spec_from_file_location("entry", {str(ROOT / "experiments" / "slot.py")!r})
entry = importlib.util.module_from_spec(spec); spec.loader.exec_module(entry)
print(json.dumps(entry.install_missing(["run"])))
entry.NEEDED["a_module_nobody_has"] = "a-distribution-nobody-has"
entry.install_missing(["run", "--wheels", {str(tmp_path / "no-wheels")!r}])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout.splitlines()[0]) == {"packages": [], "seconds": 0.0}
    assert done.returncode != 0 and "lacks a-distribution-nobody-has" in done.stderr
    assert "python -m pretrainlab.slot wheels --out" in done.stderr


# --- the command, end to end ------------------------------------------------------------------------------
# the scaled-down slot's study as arms: RoBERTa's MLM, and BERT without its NSP loss
ARMS = ['arms={roberta: ["objective=roberta"], bert-nsp0: ["objective=bert", "objective.pair_weight=0"]}']


def _small(options) -> list[str]:
    """SMALL, for a slot given ``options``: arms are its rows instead of objectives (the two together are refused)."""
    arms = any(str(o).lstrip("+").startswith(("arms=", "ablation=")) for o in options)
    given = {str(o).split("=", 1)[0] for o in options if "=" in str(o)}  # a setting the test gives wins
    return [o for o in SMALL if not (arms and o.startswith("objectives=")) and o.split("=", 1)[0] not in given]


def _slot(inputs: Path, out: Path, seed: int, work: str, *options: str, cwd: Path) -> subprocess.CompletedProcess:
    """The scaled-down slot of pretraining seed ``seed``, as a user starts it."""
    command = ["run", "--inputs", str(inputs), "--out", str(out), "--seed", str(seed), "--work", work, *options]
    command += _small(options)
    return run_command([sys.executable, str(ROOT / "experiments" / "slot.py"), *command], timeout=600, cwd=cwd)


def _record(archive: Path) -> dict:
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("report/slot.json"))
        f = tar.extractfile(member)
        assert f is not None
        return json.loads(f.read())


def _in_process(inputs: Path, out: Path, work: Path, *overrides: str):
    """The scaled-down slot of seed 0 at a given budget, as ``run_slot`` takes it in this process."""
    from pretrainlab.slot.run import SlotArgs

    return SlotArgs(
        inputs=inputs,
        out=out,
        seeds=[0],
        work=work,
        budget_flops=1e12,
        overrides=[*_small(overrides), *overrides],
        started_at=time.time(),
        installed={},
    )


def _retar(archive: Path, out: Path, edit) -> Path:
    """A copy of ``archive`` whose slot.json ``edit`` changed."""
    work = out.parent / f"{out.name}.d"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    record = next(work.rglob("report/slot.json"))
    data = json.loads(record.read_text())
    edit(data)
    record.write_text(json.dumps(data))
    with tarfile.open(out, "w:gz") as tar:
        for child in work.iterdir():
            tar.add(child, arcname=child.name)
    return out


@pytest.mark.slow
def test_two_slots_pretrain_evaluate_come_back_and_merge_into_one_report(packed, tmp_path):
    """Scaled down (tiny encoders, generated data, a slot of 75 s on a CPU), a study of two
    arms: the first slot calibrates and plans its budget by arm, the second takes it from the first one's archive
    and trains two pretraining seeds at once in its one start; each brings back one archive without
    weights; merged, they make one report over three pretraining seeds, its rows the arms; slots of
    other arms are refused as other settings. (A whole slot end to end, twice, on two cores: its time is
    the slot's minutes, which its calibration, pretraining and evaluation need.)"""
    from pretrainlab.slot.archive import MergeError, merge
    from pretrainlab.slot.inputs import unpack

    _, inputs = packed
    out = tmp_path / "out"
    # 75 s: on a loaded machine (a core busy beside it) the slot spent 11 s calibrating and pretrained for
    # 13 s (40 s are kept for evaluation, which took 6, and 5 for the report): a window the plan fills, not a
    # few steps, and the second slot's four runs train that budget in 23 s (in a slot of 90 s they took 48);
    # its runs' processes start at once (forked from the server the slot's own came from)
    first = _slot(inputs, out, 0, "s0", "--minutes", "1.25", *ARMS, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    a = out / "slot-s0.tar.gz"
    record = _record(a)
    plan = record["plan"]
    assert plan["source"] == "calibrated" and plan["budget_flops"] > 0
    assert set(plan["rates"]) == {"roberta", "bert-nsp0"} and all(r["alone"] > 0 for r in plan["rates"].values())
    assert plan["throughput"]["jobs"] == 2 and plan["throughput"]["speedup"] > 0
    assert {"setup", "unpack", "calibration", "plan", "pretraining", "evaluation", "report"} <= set(record["phases"])
    for run in ("roberta-s0", "bert-nsp0-s0"):  # trained to the budget it planned
        assert record["runs"][run]["flops"] >= plan["budget_flops"]
    with tarfile.open(a) as tar:
        names = tar.getnames()
    assert not [n for n in names if n.endswith((".ckpt", ".safetensors")) or "/encoder/" in n]
    assert (
        "slot/pretrain/bert-nsp0-s0/encoder.json" in names
        and "slot/pretrain/bert-nsp0-s0/eval/blimp/seed0.json" in names
    )
    assert "slot/report/slot.md" in names and "slot/slot.log" in names
    with tarfile.open(a) as tar:  # sst2 of both encoders and scratch fine-tuned at once (fuse_finetuning)
        fused = [json.load(tar.extractfile(f"slot/pretrain/{r}/glue{s}/sst2/seed0.json")) for r, s in SST2]
    assert [r["fused_runs"] for r in fused] == [3, 3, 3], [r.get("fused_runs") for r in fused]
    unpack(inputs, tmp_path / "s0")  # the slot wrote nothing into its inputs: they unpack (and check) as they were
    md = (tmp_path / "s0" / "slot" / "report" / "slot.md").read_text()
    assert "## The jobs at once against one after another" in md and "calibrated" in md

    again = _slot(inputs, out, 0, "s0b", *ARMS, cwd=tmp_path)
    assert again.returncode != 0 and "exists: give another --out" in again.stderr
    # the finished slot's own command again: refused before anything is written, its record kept
    kept = {f: (tmp_path / "s0" / "slot" / "report" / f).read_bytes() for f in ("slot.json", "slot.md")}
    same = _slot(inputs, out, 0, "s0", "--minutes", "1.25", *ARMS, cwd=tmp_path)
    assert same.returncode != 0 and "exists: give another --out" in same.stderr
    assert {f: (tmp_path / "s0" / "slot" / "report" / f).read_bytes() for f in kept} == kept
    assert not list(out.glob("*failed*")) and not (tmp_path / "s0b" / "slot" / "report").exists()

    second = _slot(inputs, out, "1,2", "s12", "--plan-from", str(a), *ARMS, cwd=tmp_path)  # two seeds at once
    assert second.returncode == 0, second.stderr[-3000:]
    b = out / "slot-s1-2.tar.gz"
    assert _record(b)["plan"]["budget_flops"] == plan["budget_flops"] and "calibration" not in _record(b)["phases"]
    assert _record(b)["seeds"] == [1, 2]
    runs = [f"{arm}-s{seed}" for arm in ("roberta", "bert-nsp0") for seed in (1, 2)]
    assert all(_record(b)["runs"][run]["flops"] >= plan["budget_flops"] for run in runs)

    merged = tmp_path / "merged"
    table = merge([a, b], merged)
    assert sorted(table["labels"]) == ["bert-nsp0", "roberta", "scratch"]  # the arms
    comparison = json.loads((merged / "report" / "comparison.json").read_text())
    roberta = comparison["glue"]["roberta"]["summary"]
    assert roberta["encoders"] == 3 and not roberta["conditional"]  # an interval over three pretraining seeds
    learning = json.loads((merged / "report" / "learning.json").read_text())
    assert sorted(learning) == sorted([*runs, "roberta-s0", "bert-nsp0-s0"])
    slots = (merged / "report" / "slots.md").read_text()
    assert (
        "[slot-s0.tar.gz](slot-slot-s0.md) | 0 |" in slots and "[slot-s1-2.tar.gz](slot-slot-s1-2.md) | 1, 2 |" in slots
    )
    provenance = json.loads((merged / "report" / "provenance.json").read_text())
    assert len(provenance["slots"]) == 2 and "(the slots; merged on " in provenance["device"]
    own = (merged / "report" / "slot-slot-s0.md").read_text()  # each slot's record travels with the report
    assert own.startswith("# Slot: study slot, pretraining seed 0") and "## The jobs at once" in own
    assert json.loads((merged / "report" / "slot-slot-s1-2.json").read_text())["seeds"] == [1, 2]

    with pytest.raises(MergeError, match="slot-s0.tar.gz is given twice: name each slot's archive once"):
        merge([a, a], tmp_path / "twice")
    copy = shutil.copy(a, tmp_path / "copy-of-s0.tar.gz")
    with pytest.raises(MergeError, match="each slot must pretrain another seed"):
        merge([a, copy], tmp_path / "twice")
    assert not (tmp_path / "twice").exists()  # refused before writing: the corrected merge is not "not empty"
    other = _retar(b, tmp_path / "other-lr.tar.gz", lambda r: r["settings"].update(lr=5e-4))
    with pytest.raises(MergeError, match="the study's settings differ .*lr: 0.002 against 0.0005"):
        merge([a, other], tmp_path / "mixed")
    other_arms = _retar(
        b, tmp_path / "other-arms.tar.gz", lambda r: r["settings"]["arms"].update({"bert-nsp0": ["objective=bert"]})
    )
    with pytest.raises(MergeError, match="the study's settings differ .*arms.bert-nsp0"):
        merge([a, other_arms], tmp_path / "mixed-arms")
    other_code = _retar(b, tmp_path / "other-code.tar.gz", lambda r: r["code"].update(digest="0" * 16))
    with pytest.raises(MergeError, match="the code differs"):
        merge([a, other_code], tmp_path / "mixed-code")
    failed = _retar(b, tmp_path / "failed.tar.gz", lambda r: r.update(error="RuntimeError: out of time"))
    with pytest.raises(MergeError, match="a slot that failed"):
        merge([a, failed], tmp_path / "with-failed")
    # a slot whose time ran out before it planned: failed, not "not a slot's record" (as it once said)
    early = _retar(b, tmp_path / "early.tar.gz", lambda r: (r.update(error="TimeUp: out of time"), r.pop("plan")))
    with pytest.raises(MergeError, match="early.tar.gz is the archive of a slot that failed .TimeUp: out of time"):
        merge([a, early], tmp_path / "with-early")


def test_a_slot_keeps_to_its_time_and_brings_back_what_finished(packed, tmp_path):
    """A slot given far less time than its work takes stops the work in progress when its minutes
    are up (less what writing the archive keeps) and still brings back an archive, which names the
    phase the time ran out in; the merge refuses it as a slot that failed."""
    from pretrainlab.slot.archive import MergeError, merge

    _, inputs = packed
    out = tmp_path / "out"
    started = time.time()
    done = _slot(inputs, out, 0, "s0", "--minutes", "0.3", "--budget-flops", "1e12", cwd=tmp_path)
    took = time.time() - started
    assert done.returncode != 0 and "TimeUp: the slot's 0.3 minutes ran out" in done.stderr, done.stderr[-3000:]
    assert took < 0.3 * 60 + 20, took  # stopped, not run to the end (the full scaled-down slot takes minutes)
    (archive,) = out.glob("slot-s0-failed-*.tar.gz")
    record = _record(archive)
    assert record["error"].startswith("TimeUp: the slot's 0.3 minutes ran out (less 5 s kept for its archive) during")
    assert record["wall_s"] < 0.3 * 60 + 10
    with pytest.raises(MergeError, match="a slot that failed"):
        merge([archive], tmp_path / "merged")


def test_a_slot_that_fails_after_a_finished_one_keeps_the_finished_record(packed, tmp_path, monkeypatch):
    """A failed record never replaces a finished one: it is written beside it, under a name of its own."""
    from pretrainlab.slot.run import run_slot

    _, inputs = packed
    work = tmp_path / "w"
    report = work / "slot" / "report"
    report.mkdir(parents=True)
    (report / "slot.json").write_text('{"seeds": [0], "plan": {"budget_flops": 1.0}}')

    def fails(cfg, timeline=None):
        raise RuntimeError("a GPU fell off the bus")

    monkeypatch.setattr("pretrainlab.studies.ablation.run_study", fails)
    args = _in_process(inputs, tmp_path / "out", work)
    with pytest.raises(RuntimeError, match="fell off the bus"):
        run_slot(args)
    assert json.loads((report / "slot.json").read_text()) == {"seeds": [0], "plan": {"budget_flops": 1.0}}
    (failed,) = report.glob("slot-failed-*.json")
    assert "fell off the bus" in json.loads(failed.read_text())["error"]
    assert list((tmp_path / "out").glob("slot-s0-failed-*.tar.gz"))  # what it brings back, as before


def test_a_work_folder_holding_another_seeds_slot_is_refused_and_left_as_it_was(packed, tmp_path):
    """``--seed 1 --work <seed 0's work folder>`` once replaced seed 0's slot.json and carried its runs in
    seed 1's archive."""
    from dataclasses import replace

    from pretrainlab.config import ConfigError
    from pretrainlab.slot.run import run_slot

    _, inputs = packed
    study = tmp_path / "w" / "slot"
    (study / "pretrain" / "roberta-s0" / "encoder").mkdir(parents=True)
    (study / "report").mkdir(parents=True)
    record = json.dumps({"seeds": [0], "plan": {"budget_flops": 1e12}})
    (study / "report" / "slot.json").write_text(record)
    args = replace(_in_process(inputs, tmp_path / "out", tmp_path / "w"), seeds=[1, 2])
    with pytest.raises(ConfigError, match="holds the slot of pretraining seed 0 .* Give each slot its own --work"):
        run_slot(args)
    assert (study / "report" / "slot.json").read_text() == record
    assert sorted(p.name for p in study.iterdir()) == ["pretrain", "report"]
    assert list((tmp_path / "out").iterdir()) == []


def test_a_slots_seeds_come_from_its_study_or_the_command_line_and_every_run_trains_at_once():
    """``--seed 0,1,2`` or a question preset's ``seeds`` make one slot of three pretraining seeds;
    ``jobs: all`` is then every encoder the study evaluates (each arm's three runs and the scratch
    baseline), so that the runs the plan times together train together. Bad seeds are refused."""
    import argparse

    from pretrainlab.config import ConfigError
    from pretrainlab.slot.__main__ import seed_list
    from pretrainlab.slot.run import compose_study, seeds_label, study_seeds

    assert study_seeds([]) == [0] and study_seeds(["+ablation=electra_vs_mlm"]) == [0, 1, 2]
    assert seed_list("0,1,2") == [0, 1, 2] and seeds_label([0, 1, 2]) == "s0-1-2" and seeds_label([3]) == "s3"
    for bad in ("0,0", "-1", "a", "0,,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)
    with pytest.raises(ConfigError, match="seeds=\\[0, 0\\]: the slot's pretraining seeds are a list of distinct"):
        study_seeds(["seeds=[0,0]"])
    question = compose_study(Path("inputs"), None, Path("w"), ["+ablation=electra_vs_mlm"])
    assert list(question.seeds) == [0, 1, 2] and question.jobs == 2 * 3 + 1
    assert compose_study(Path("inputs"), [4], Path("w"), ["+ablation=electra_vs_mlm"]).jobs == 2 + 1
    assert compose_study(Path("inputs"), [0], Path("w"), []).jobs == 9 + 1  # the nine objectives and scratch


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["objectives=[robrta]"], "objectives: robrta is not an objective of conf/objective/ (albert, bert"),
        (["jobs=0"], "jobs=0: give the number of runs to train at once, 1 or more"),
        (
            ["+ablation=electra_vs_mlmx"],
            "+ablation=electra_vs_mlmx: there is no conf/ablation/electra_vs_mlmx.yaml; the options of ablation are "
            + ", ".join(sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml"))[:3]),
        ),
        (["jobs=1"], "jobs=1: the slot trains its 2 pretraining runs all at once (its plan assumes it); give jobs=2"),
        (["baseline=electra"], "baseline='electra' is not a row of this study: name one of roberta, bert, scratch"),
        (["lr=-1"], "pretraining run roberta-s0 of the study: optim.lr=-1: must be positive"),
        (["suite.glue_tasks=[colaa]"], "unknown evaluation task 'colaa'"),
        (['arms={a: ["objective=roberta"], a: ["objective=bert"]}'], "arms: a named twice"),
        (
            ['arms={a: ["objective=roberta"], b: ["objective=roberta"]}', "baseline=a"],
            "arms a and b compose the same pretraining run",
        ),
    ],
)
def test_a_slot_whose_study_would_be_refused_writes_no_record_and_no_archive(packed, tmp_path, overrides, says):
    """The study's own checks run before the slot's record exists: a misspelt objective, a bad jobs,
    baseline, optimizer setting or task is refused naming it, with no failed slot.json in the work
    folder and no failed archive in --out (they once came after the record, some as a traceback)."""
    from pretrainlab.config import ConfigError
    from pretrainlab.slot.run import run_slot

    _, inputs = packed
    args = _in_process(inputs, tmp_path / "out", tmp_path / "w", *overrides)
    with pytest.raises(ConfigError) as refused:
        run_slot(args)
    assert says in str(refused.value)
    assert list((tmp_path / "out").iterdir()) == []
    assert not list((tmp_path / "w").rglob("slot*.json")) and not (tmp_path / "w" / "slot" / "pretrain").exists()


def _calibrated(study_settings: dict, seeds: list[int], device: dict, jobs: dict[str, float]) -> dict:
    """The record of a slot that calibrated ``jobs`` (job -> TFLOP/s among all of them, twice that alone)."""

    def window(seconds: float, tflops: float) -> dict:
        return {
            "seconds": seconds,
            "steps": 100.0,
            "tokens": tflops * seconds * 1e12 / 2e6,
            "flops": tflops * seconds * 1e12,
        }

    measured = {
        job: {
            "job": job,
            "flops_per_token": 2e6,
            "setup_s": 10.0 + k,
            "sanity_s": 5.0,
            "warm_after_s": 7.0,
            "together": window(12.0, tflops),
            "alone": window(3.0, 2 * tflops),
        }
        for k, (job, tflops) in enumerate(jobs.items())
    }
    return {
        "started": "2026-11-28 19:17:23 UTC",
        "seeds": seeds,
        "device": device,
        "code": {"digest": "0123456789abcdef"},
        "settings": study_settings,
        "mps": {"running": False, "status": "not running"},
        "plan": {"budget_flops": 3.4e15, "source": "calibrated", "measured": measured},
        "phases": {"evaluation": {"seconds": 71.0}},
    }


def test_a_slot_plans_from_the_throughput_an_earlier_slot_of_the_same_runs_measured(packed, tmp_path, monkeypatch):
    """``--rates-from``: no calibration; the budget is the largest that fits this slot's own time at the
    throughput an earlier slot calibrated (its runs of the i-th seed are this slot's of the i-th seed),
    each run starting after what its calibration job took to get warm there, since nothing compiled
    here before; slot.md names where the throughput was measured. Refused before any work when that
    slot ran other pretraining runs, as many at once on another device, or did not calibrate; its
    evaluation settings may differ (they do not change how fast pretraining runs)."""
    from dataclasses import replace

    from pretrainlab.config import ConfigError
    from pretrainlab.slot.device import describe
    from pretrainlab.slot.plan import Rate, largest_budget
    from pretrainlab.slot.run import compose_study, run_slot, settings

    _, inputs = packed
    overrides = _small([])
    study = settings(compose_study(tmp_path, [0, 1], tmp_path, overrides))
    study["suite"] = {**study["suite"], "seeds": [0, 1, 2]}  # another evaluation: the same pretraining runs
    jobs = {"roberta-s0": 2.0, "bert-s0": 1.0, "roberta-s1": 2.0, "bert-s1": 1.0}
    earlier = tmp_path / "slot-electra.json"
    earlier.write_text(json.dumps(_calibrated(study, [0, 1], describe(), jobs)))
    before = earlier.read_bytes()
    trained = {}

    def pretrain(cfg, timeline=None):
        trained["budget"] = float(cfg.budget_flops)

    monkeypatch.setattr("pretrainlab.studies.ablation.run_study", pretrain)
    args = replace(
        _in_process(inputs, tmp_path / "out", tmp_path / "w"),
        seeds=[3, 4],
        budget_flops=None,
        rates_from=earlier,
        minutes=10.0,
    )
    run_slot(args)
    record = json.loads((tmp_path / "w" / "slot" / "report" / "slot.json").read_text())
    plan = record["plan"]
    assert "calibration" not in record["phases"] and "plan" in record["phases"]
    assert plan["source"].startswith("planned from the throughput measured in the calibration of slot-electra.json")
    assert plan["measured_in"] == {
        "from": "slot-electra.json",
        "started": "2026-11-28 19:17:23 UTC",
        "device": describe()["device"],
        "code": "0123456789abcdef",
    }
    assert sorted(plan["rates"]) == ["bert-s3", "bert-s4", "roberta-s3", "roberta-s4"]
    assert plan["rates"]["bert-s4"] == {"together": 1e12, "alone": 2e12}  # bert-s1's there
    assert plan["startup_s"] == pytest.approx(13.0 + 5.0 + 7.0)  # the slowest job's setup, validation and compile there
    # the largest budget for this slot's window at those rates: the plan's own arithmetic, not calibration's
    rates = {job: Rate(r["together"], r["alone"]) for job, r in plan["rates"].items()}
    again = largest_budget(rates, plan["window_s"], plan["startup_s"], plan["finish_s"], plan["safety"])
    assert trained["budget"] == plan["budget_flops"] == again.budget_flops > 1e14
    assert json.loads((tmp_path / "w" / "slot" / "plan.json").read_text())["budget_flops"] == plan["budget_flops"]
    md = (tmp_path / "w" / "slot" / "report" / "slot.md").read_text()
    assert "Planned from the throughput measured in the calibration of slot-electra.json: a pretraining window" in md
    assert (
        "Measured in the calibration of slot-electra.json (started 2026-11-28 19:17:23 UTC, code 0123456789abcdef)"
        in md
    )
    assert "| roberta-s4 | 2.00 | 4.00 |" in md
    assert earlier.read_bytes() == before

    def refused(record: dict, says: str, **changes) -> None:
        path = tmp_path / f"other-{len(list(tmp_path.glob('other-*')))}.json"
        path.write_text(json.dumps(record))
        work = tmp_path / f"w-{path.stem}"
        with pytest.raises(ConfigError) as e:
            run_slot(replace(args, work=work, out=tmp_path / f"out-{path.stem}", rates_from=path, **changes))
        assert says in str(e.value) and "leave out --rates-from" in str(e.value)
        assert not list(work.rglob("slot*.json")) and not list((tmp_path / f"out-{path.stem}").iterdir())

    refused(
        {**_calibrated({**study, "lr": 5e-4}, [0, 1], describe(), jobs)},
        "its pretraining runs are not this slot's (lr: 0.0005 against 0.002)",
    )
    gpu = {**describe(), "device": "NVIDIA H200 (143771 MiB)", "gpus": 1}
    refused(_calibrated(study, [0, 1], gpu, jobs), "measured on NVIDIA H200 (143771 MiB), and this slot runs on cpu")
    refused(
        _calibrated(study, [0], describe(), {"roberta": 2.0, "bert": 1.0}),
        "it trained 1 pretraining seed(s) at once and this slot trains 2",
    )
    given = _calibrated(study, [0, 1], describe(), jobs)
    given["plan"] = {"budget_flops": 2e15, "source": "given (--budget-flops)"}
    refused(given, "that slot did not calibrate (its budget: given (--budget-flops))")
    older = _calibrated(study, [0, 1], describe(), jobs)
    del older["plan"]["measured"]["bert-s1"]["warm_after_s"]  # a calibration that did not time its compile
    refused(older, "did not record how long bert-s1 took to start and compile")
    assert "--rates-from plans a budget" in _refusal(
        replace(args, work=tmp_path / "w2", out=tmp_path / "out2", budget_flops=1e12)
    )


def test_the_published_question_slots_calibration_plans_the_preset_as_shipped(tmp_path):
    """docs/slot.md's ``--rates-from`` command: the ELECTRA question slot's published calibration is
    that of ``+ablation=electra_vs_mlm`` as shipped (on a device of its name), so the command is not
    refused; a change to the preset's pretraining makes it refused, and the docs must say so."""
    from pretrainlab.slot.run import compose_study, rates_from

    published = ROOT / "docs" / "results" / "gpu-electra-vs-mlm" / "slot-electra-vs-mlm-s0-1-2.json"
    assert (
        "--rates-from docs/results/gpu-electra-vs-mlm/slot-electra-vs-mlm-s0-1-2.json"
        in (ROOT / "docs" / "slot.md").read_text()
    )
    device = json.loads(published.read_text())["device"]
    cfg = compose_study(tmp_path, None, tmp_path, ["+ablation=electra_vs_mlm"])
    earlier = rates_from(published, cfg, [0, 1, 2], device)
    assert sorted(earlier["measured"]) == sorted(f"{arm}-s{s}" for arm in ("mlm", "electra") for s in (0, 1, 2))
    assert earlier["mps"] and earlier["evaluation_s"] > 0
    from pretrainlab.config import ConfigError

    with pytest.raises(ConfigError, match="not this slot's .*generator_scale: 0.5 against 0.25"):
        rates_from(
            published,
            compose_study(tmp_path, None, tmp_path, ["+ablation=electra_vs_mlm", "generator_scale=0.25"]),
            [0, 1, 2],
            device,
        )


def _refusal(args) -> str:
    from pretrainlab.config import ConfigError
    from pretrainlab.slot.run import run_slot

    with pytest.raises(ConfigError) as e:
        run_slot(args)
    return str(e.value)


def test_a_slot_given_a_budget_smaller_than_a_step_is_refused_before_any_work(packed, tmp_path):
    """``--budget-flops 2e5`` (for 2e15): every run would stop after one step and the slot would spend its
    minutes evaluating encoders that learned nothing; refused with the fix, no record and no archive."""
    from dataclasses import replace

    _, inputs = packed
    args = replace(_in_process(inputs, tmp_path / "out", tmp_path / "w"), budget_flops=2e5)
    says = _refusal(args)
    assert "budget.flops=2e+05 is less than one optimizer step of this run" in says and "--budget-flops" in says
    assert list((tmp_path / "out").iterdir()) == [] and not list((tmp_path / "w").rglob("slot*.json"))


def test_a_continued_slot_reports_its_earlier_starts_and_the_runs_as_they_ran_there(packed, tmp_path, monkeypatch):
    """A slot stopped in its evaluation and continued: the finished record keeps the first start's
    (phases, error, wall-clock), the runs pretrained there are reported as they ran there (not at a
    negative time into a pretraining phase that trained nothing), no throughput is made up for the
    empty phase, and slot.md gives pretraining's share of the wall-clock over both starts."""
    from pretrainlab.slot.run import run_slot

    _, inputs = packed
    work = tmp_path / "w"
    report = work / "slot" / "report"
    report.mkdir(parents=True)
    encoder = work / "slot" / "pretrain" / "roberta-s0" / "encoder"
    encoder.mkdir(parents=True)
    trained = {"objective": "roberta", "global_step": 40, "tokens_seen": 5e6, "flops": 1e12, "seconds": 150.0}
    (encoder / "config.json").write_text(json.dumps({"pretraining": trained}))
    an_hour_ago = time.time() - 3600
    os.utime(encoder / "config.json", (an_hour_ago, an_hour_ago))
    first = {
        "seeds": [0],
        "started": "earlier",
        "minutes": 9.0,
        "wall_s": 524.0,
        "error": "TimeUp: the slot's 9 minutes ran out during its evaluation phase",
        "plan": {"budget_flops": 1e12, "source": "given (--budget-flops)"},
        "phases": {
            "pretraining": {"from_s": 25.0, "seconds": 233.0},
            "evaluation": {"from_s": 258.0, "seconds": 266.0},
        },
        "runs": {
            "roberta-s0": {"objective": "roberta", "steps": 40, "tokens": 5e6, "flops": 1e12, "exported_s": 208.0}
        },
        "pretraining_throughput": {"tokens_per_s": 3.1e6, "flops_per_s": 7.7e13},
    }
    (report / "slot.json").write_text(json.dumps(first))

    def evaluates(cfg, timeline):
        timeline("pretraining")  # nothing left to pretrain
        timeline("evaluation")

    monkeypatch.setattr("pretrainlab.studies.ablation.run_study", evaluates)
    monkeypatch.setattr("pretrainlab.studies.ablation.check_study", lambda cfg: None)  # the run above is a record only
    args = _in_process(inputs, tmp_path / "out", work)
    run_slot(args)
    record = json.loads((report / "slot.json").read_text())
    assert "error" not in record
    (earlier,) = record["earlier"]
    assert earlier["error"] == first["error"] and earlier["wall_s"] == 524.0
    assert record["runs"]["roberta-s0"] == {**first["runs"]["roberta-s0"], "start": 1}
    assert "pretraining_throughput" not in record
    md = (report / "slot.md").read_text()
    assert "## Starts" in md and "| 208 s (start 1) |" in md
    share = re.search(r"\*\*Pretraining\*\*: (\d+) s of the (\d+) s of wall-clock over its 2 starts", md)
    assert share and int(share[1]) == 233 and int(share[2]) >= 524, md
    assert "as it ran in start 1: 3.10M tokens/s and 77.00 TFLOP/s" in md
    assert list((tmp_path / "out").glob("slot-s0.tar.gz"))


def test_a_completed_record_read_again_makes_up_no_rate_for_a_start_that_pretrained_nothing():
    """The published gpu-slot-s0 record, completed twice (``with_earlier`` on a record whose runs were
    already an earlier start's), said its second start ran at 1817.93M tokens/s over a 0.4 s phase that
    trained nothing."""
    from pretrainlab.slot.report import slot_markdown
    from pretrainlab.slot.run import with_earlier

    run = {"objective": "roberta", "steps": 40, "tokens": 7e8, "flops": 2e15, "exported_s": 208.0, "start": 1}
    record = {
        "seeds": [0],
        "phases": {"pretraining": {"from_s": 24.7, "seconds": 0.4}, "evaluation": {"from_s": 25.1, "seconds": 58.0}},
        "runs": {"roberta-s0": run},
        "earlier": [{"phases": {"pretraining": {"from_s": 25.0, "seconds": 233.0}}, "runs": {"roberta-s0": run},
                     "pretraining_throughput": {"tokens_per_s": 3.0e6, "flops_per_s": 8.6e12}}],
        "pretraining_throughput": {"tokens_per_s": 1.75e9, "flops_per_s": 5e15},
    }  # fmt: skip
    again = with_earlier(record, record.pop("earlier"))
    assert "pretraining_throughput" not in again and again["runs"]["roberta-s0"] == run
    md = slot_markdown(again)
    assert "as it ran in start 1: 3.00M tokens/s" in md
    assert "Nothing was pretrained in start 2: every run had been pretrained before it." in md
    assert "start 2: 1750" not in md


def test_a_slots_folders_and_archives_that_cannot_be_used_are_named_without_a_traceback(packed, tmp_path, capsys):
    from pretrainlab.slot.__main__ import main

    _, inputs = packed
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["merge", str(inputs), "--out", str(a_file)]) == 2
    assert "is a file: merge into a new directory" in capsys.readouterr().err
    assert main(["pack", "--corpus", str(tmp_path), "--out", str(a_file / "in.tar.xz")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--out .*a-file is a file: give a folder"):
        main(["wheels", "--out", str(a_file)])
    assert main(["run", "--inputs", str(inputs), "--out", str(a_file / "out"), "--seed", "0"]) == 2
    assert "--out " in (err := capsys.readouterr().err) and "cannot be made a folder" in err

    def archive(name: str, text: str) -> Path:
        folder = tmp_path / name / "slot" / "report"
        folder.mkdir(parents=True)
        (folder / "slot.json").write_text(text)
        path = tmp_path / f"{name}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            tar.add(tmp_path / name / "slot", arcname="slot")
        return path

    damaged, no_settings = archive("damaged", "{not json"), archive("bare", '{"seeds": [0]}')
    assert main(["merge", str(damaged), str(no_settings), "--out", str(tmp_path / "m")]) == 2
    assert "report/slot.json is not JSON" in capsys.readouterr().err and not (tmp_path / "m").exists()
    assert main(["merge", str(no_settings), "--out", str(tmp_path / "m")]) == 2
    assert "records no settings, plan" in capsys.readouterr().err
    odd = archive("odd", '{"seeds": [0], "settings": {}, "plan": {"budget_flops": "lots"}}')
    work, out = tmp_path / "w", tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--inputs",
                str(inputs),
                "--out",
                str(out),
                "--seed",
                "1",
                "--work",
                str(work),
                "--plan-from",
                str(odd),
            ]
        )
        == 2
    )
    assert "records a budget of 'lots', not a number of FLOPs" in capsys.readouterr().err
    assert not list(out.iterdir()) and not (work / "slot").exists()  # refused before any work or record


def test_a_slots_cost_gives_its_phases_wall_clock_and_labels_summed_process_time(tmp_path):
    """gpu-slot-s0's cost.md once said "Pretraining 10.7 min (...), evaluation 44.2 min: 55.0 min in all" for a
    slot of 10.2 minutes: process time summed over runs at once, shown as durations (and step times taken on
    the host's clock, which a GPU's queued kernels outrun)."""
    from pretrainlab.slot.report import recost
    from pretrainlab.studies.cost import cost_report
    from tools.docs import _source

    report = tmp_path / "report"
    runs = []
    for name, clock in (("roberta-s0", None), ("bert-s0", "device")):
        encoder = tmp_path / "pretrain" / name / "encoder"
        encoder.mkdir(parents=True)
        record = {"objective": name[:-3], "global_step": 3000, "tokens_seen": 9e7, "flops": 2e15, "seconds": 70.0}
        (encoder / "config.json").write_text(
            json.dumps({"pretraining": {**record, **({"seconds_clock": clock} if clock else {})}})
        )
        runs.append(encoder.parent)
    cost_report(runs, report, jobs=10)
    md = (report / "cost.md").read_text()
    assert "in all" not in md and "Process time: pretraining 2.3 min" in md and "10 at a time" in md
    first = {"phases": {"pretraining": {"seconds": 233.0}, "evaluation": {"seconds": 266.0}}}
    second = {"phases": {"pretraining": {"seconds": 0.4}, "evaluation": {"seconds": 58.0}}, "earlier": [first],
              "device": {"device": "1 x NVIDIA H200", "cuda": "13.0"}}  # fmt: skip
    recost(report, [second], "over its 2 starts")
    md = (report / "cost.md").read_text()
    assert "Wall-clock over its 2 starts: pretraining 3.9 min, evaluation 5.4 min (**9.3 min**)" in md
    assert "The training-step times of roberta-s0 were taken on the host's clock" in md  # bert-s0's on the device
    (report / "provenance.json").write_text(json.dumps({"command": "x", "date": "d", "device": "1 x NVIDIA H200"}))
    assert "Wall-clock over its 2 starts: pretraining 3.9 min, evaluation 5.4 min." in _source(report, "link")
