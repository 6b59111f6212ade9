"""What is already written is never lost, overwritten, mixed with another run's, or executed:
exports, run directories, checkpoints, caches and their permissions."""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrainlab.export import load_encoder
from pretrainlab.pretraining.run import run
from pretrainlab.runtime.checkpoints import CheckpointError
from pretrainlab.runtime.rundir import RunDirError
from tests.conftest import ROOT, SMALL, compose_train, run_command

QUICK = [*SMALL, "max_steps=4", "val_every=4", "checkpoint_every=4"]


@pytest.fixture
def trained(shared_run) -> Path:
    """A finished run (roberta, 4 steps), made once per session and read-only: tests copy it before
    changing anything in it."""
    return shared_run(*QUICK)[0]


def export_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "pretrainlab.export", *args], cwd=cwd)


def listing(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# --- exports ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["hf", "native"])
def test_export_never_replaces_the_working_directory_or_a_foreign_one(trained, tmp_path, fmt):
    work = tmp_path / "work"
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "draft.txt").write_text("three weeks of notes")
    (work / "results.csv").write_text("a,b\n1,2\n")
    before = listing(work)
    for force in ([], ["--force"]):  # the working directory is never replaced, not even with --force
        out = export_cli(str(trained), ".", "--format", fmt, *force, cwd=work)
        assert out.returncode != 0 and "working directory" in out.stderr, out.stderr
        assert listing(work) == before
    # nor a directory containing the source
    out = export_cli(str(trained), str(trained.parent), "--format", fmt, "--force", cwd=tmp_path)
    assert out.returncode != 0 and "the source" in out.stderr
    assert (trained / "encoder" / "encoder.safetensors").is_file()

    # a non-empty directory that is not an export: refused, then replaced with --force
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    out = export_cli(str(trained), str(foreign), "--format", fmt, cwd=tmp_path)
    assert out.returncode != 0 and "--force" in out.stderr and (foreign / "keep.txt").read_text() == "mine"
    assert export_cli(str(trained), str(foreign), "--format", fmt, "--force", cwd=tmp_path).returncode == 0
    assert not (foreign / "keep.txt").exists() and (foreign / "config.json").is_file()
    # an earlier export of the same format is replaced without --force
    first = (foreign / "config.json").read_bytes()
    assert export_cli(str(trained), str(foreign), "--format", fmt, cwd=tmp_path).returncode == 0
    assert (foreign / "config.json").read_bytes() == first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left beside it


def test_an_export_killed_midway_leaves_nothing_behind_for_long(trained, tmp_path):
    """A killed export leaves its temporary directory (up to a full copy of the weights); the next
    export to the same place removes it."""
    out = tmp_path / "hf"
    script = (
        "import sys, time\n"
        "import pretrainlab.export.hf as hf\n"
        "from pretrainlab.export.__main__ import main\n"
        "save = hf.save_file\n"
        "def slow(*a, **k):\n"
        "    save(*a, **k)\n"
        "    print('weights written', flush=True)\n"
        "    time.sleep(120)\n"
        "hf.save_file = slow\n"
        f"main([{str(trained)!r}, {str(out)!r}, '--format', 'hf'])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "weights written"
    proc.kill()
    proc.wait()
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]
    assert left and any(f.name == "model.safetensors" for p in left for f in p.iterdir())
    assert export_cli(str(trained), str(out), "--format", "hf", cwd=tmp_path).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_hf_export_takes_heads_only_from_a_checkpoint_of_the_exported_encoder(trained, tmp_path, caplog):
    import transformers

    other = tmp_path / "other"
    run(compose_train(*QUICK, "seed=1"), other)
    mixed = tmp_path / "mixed"
    shutil.copytree(trained, mixed)
    shutil.copy(other / "checkpoints" / "last.ckpt", mixed / "checkpoints" / "last.ckpt")  # another run's heads
    out = tmp_path / "hf"
    from pretrainlab.export.hf import export_hf

    export_hf(mixed, out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    assert "holds another encoder" in caplog.text
    export_hf(trained, tmp_path / "hf-own")  # its own checkpoint: the MLM head is exported
    assert json.loads((tmp_path / "hf-own" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf-own", local_files_only=True)


# --- checkpoints ---------------------------------------------------------------------------------------
class _Planted:
    """Creates a file when unpickled: a stand-in for code hidden in a checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_in_a_checkpoint_is_never_run(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    marker = tmp_path / "code-ran"
    good = torch.load(copy / "checkpoints" / "last.ckpt", weights_only=True)
    torch.save({**good, "extra": _Planted(marker)}, copy / "checkpoints" / "last.ckpt")

    from pretrainlab.export.hf import export_hf

    with pytest.raises(CheckpointError, match="could run arbitrary code"):
        export_hf(copy, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="last.ckpt holds Python objects"):
        run(compose_train(*QUICK, "max_steps=8", "ckpt_path=last"), copy)
    assert not marker.exists()
    assert not (tmp_path / "hf").exists()
    source = [p for p in (ROOT / "src").rglob("*.py")] + list((ROOT / "experiments").glob("*.py"))
    assert not [p for p in source if _unsafe_loads(p)]  # no call of ours unpickles with weights_only=False


def _unsafe_loads(path: Path) -> list[int]:
    """Lines of ``path`` with a call passing ``weights_only=False`` (text that shows a user such a
    command, to run on a file they trust, is not a call)."""
    import ast

    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        for k in node.keywords
        if k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is False
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", r"is empty \(0 bytes\)"),
        (b"this is not a checkpoint\n" * 10, "is not a PyTorch checkpoint"),
        (None, "is truncated or corrupt"),
    ],
)
def test_a_damaged_checkpoint_is_named_with_its_problem(trained, tmp_path, content, message):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    last = copy / "checkpoints" / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3] if content is None else content)
    with pytest.raises(CheckpointError, match=message) as e:
        run(compose_train(*QUICK, "max_steps=8", "ckpt_path=last"), copy)
    assert str(last) in str(e.value) and "weights_only=False" not in str(e.value)


def test_resuming_another_objectives_checkpoint_is_refused_before_any_work(trained, tmp_path, monkeypatch):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)

    def no_work(*a, **k):
        raise AssertionError("the corpus was read before the checkpoint was checked")

    monkeypatch.setattr("pretrainlab.pretraining.run.PretrainData", no_work)
    with pytest.raises(CheckpointError, match="trained with objective=roberta, and this run is objective=electra"):
        run(compose_train(*QUICK, "objective=electra", "ckpt_path=last"), copy)
    with pytest.raises(CheckpointError, match=r"model settings .*model.hidden_size=128 \(this run: 256\)"):
        run(compose_train(*QUICK, "model=mini", "ckpt_path=last"), copy)


def test_a_checkpoint_from_before_a_setting_existed_resumes_at_the_value_it_was_made_with(trained, tmp_path):
    """A checkpoint recorded before objective.whole_word and objective.mask_rate_start existed was
    trained without whole-word masking and at a constant rate: it resumes with them off, and is
    refused for whole-word masking, naming the setting."""
    from pretrainlab.runtime.checkpoints import KEY

    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    last = copy / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    for added in ("whole_word", "mask_rate_start"):
        del checkpoint[KEY]["objective"][added]  # as recorded before the settings existed
    torch.save(checkpoint, last)
    with pytest.raises(CheckpointError, match=r"objective.whole_word=False \(this run: True\)"):
        run(compose_train(*QUICK, "max_steps=6", "ckpt_path=last", "objective.whole_word=true"), copy)
    result = run(compose_train(*QUICK, "max_steps=6", "val_every=6", "ckpt_path=last"), copy)
    assert result["global_step"] == 6


def test_resuming_on_other_data_is_refused_before_training(trained, tmp_path):
    """A checkpoint records the corpus and tokenizer it was trained on: resuming it on another corpus
    is refused, naming the corpus, and leaves the run directory as it was; a checkpoint written before
    checkpoints recorded their data resumes as before."""
    from pretrainlab.runtime.checkpoints import KEY

    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    last = copy / "checkpoints" / "last.ckpt"
    assert set(torch.load(last, weights_only=True)[KEY]["data"]) == {"corpus", "tokenizer"}
    before = {k: v for k, v in listing(copy).items() if k != "train.log"}  # the log says what was refused
    other = [o for o in QUICK if not o.startswith("data.num_documents")]
    with pytest.raises(CheckpointError, match=r"trained on other data than this run's: the corpus .* then, .* now"):
        run(compose_train(*other, "data.num_documents=301", "max_steps=6", "ckpt_path=last"), copy)
    assert {k: v for k, v in listing(copy).items() if k != "train.log"} == before
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint[KEY]["data"]
    torch.save(checkpoint, last)
    result = run(compose_train(*QUICK, "max_steps=6", "val_every=6", "ckpt_path=last"), copy)
    assert result["global_step"] == 6


def test_a_run_records_the_code_it_was_trained_with_over_every_resumption(trained, tmp_path):
    """The checkpoint and the export name the code (pretrainlab's version; in a git checkout the commit
    and whether it had uncommitted changes; torch, Lightning, Python); a run resumed under other code
    lists both, oldest first, and a study's cost report says its encoders' code was mixed."""
    from pretrainlab.runtime.checkpoints import KEY
    from pretrainlab.studies.cost import cost_markdown, study_cost

    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    here = git.stdout.strip() if git.returncode == 0 else None
    exported = json.loads((trained / "encoder" / "config.json").read_text())["pretraining"]["software"]
    assert len(exported) == 1 and exported[0]["commit"] == here and exported[0]["torch"] == torch.__version__
    assert exported == torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)[KEY]["software"]

    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    last = copy / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    older = {**exported[0], "pretrainlab": "0.0.9", "commit": "0" * 40, "dirty": False}
    checkpoint[KEY]["software"] = [older]
    torch.save(checkpoint, last)
    run(compose_train(*QUICK, "max_steps=6", "val_every=6", "ckpt_path=last"), copy)
    history = json.loads((copy / "encoder" / "config.json").read_text())["pretraining"]["software"]
    assert history == [older, exported[0]]
    report = cost_markdown(study_cost([trained, copy]))
    assert "pretrained with more than one version of the code" in report
    assert f"| run | pretrainlab 0.0.9 (commit 0000000000), torch {torch.__version__}, lightning" in report
    assert "; then pretrainlab" in report
    assert "Every encoder was pretrained with" in cost_markdown(study_cost([trained]))


def test_a_damaged_tokenizer_file_is_named(trained, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "truncation": nul')
    with pytest.raises(ValueError, match=f"{bad} is not a tokenizers tokenizer.json"):
        run(
            compose_train(
                *[o for o in QUICK if not o.startswith("tokenizer.")], "tokenizer=pretrained", f"tokenizer.path={bad}"
            ),
            tmp_path / "run",
        )
    copy = tmp_path / "export"
    shutil.copytree(trained / "encoder", copy)
    (copy / "tokenizer.json").write_bytes(b"")
    with pytest.raises(ValueError, match=r"tokenizer.json is empty \(0 bytes\). The export is damaged"):
        load_encoder(copy)


# --- run directories ----------------------------------------------------------------------------------
def test_a_second_run_into_an_occupied_directory_is_refused_unless_it_resumes_or_overwrites(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    before = listing(copy)
    with pytest.raises(RunDirError, match="already holds a run") as e:
        run(compose_train(*QUICK, "seed=3"), copy)
    assert "ckpt_path=last" in str(e.value) and "overwrite=true" in str(e.value)
    assert listing(copy) == before

    # the command line refuses before Hydra writes its .hydra/ files into the directory
    cli = run_command(
        [sys.executable, "train.py", *QUICK, "seed=3", f"hydra.run.dir={copy}"],
        cwd=ROOT,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert cli.returncode != 0 and "already holds a run" in cli.stderr
    assert listing(copy) == before

    # resuming it is allowed; overwrite=true starts afresh, with none of the old checkpoints left
    run(compose_train(*QUICK, "max_steps=6", "ckpt_path=last"), copy)
    assert torch.load(copy / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    run(compose_train(*QUICK, "seed=3", "max_steps=2", "checkpoint_every=2", "overwrite=true"), copy)
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["last.ckpt", "step=2.ckpt"]
    assert torch.load(copy / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2


def test_the_wandb_run_continues_only_when_the_run_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb = [o for o in QUICK if not o.startswith("logger=")] + ["logger=wandb"]
    run(compose_train(*wandb), tmp_path)
    first = (tmp_path / ".wandb_id").read_text()
    run(compose_train(*wandb, "max_steps=6", "ckpt_path=last"), tmp_path)
    assert (tmp_path / ".wandb_id").read_text() == first
    run(compose_train(*wandb, "overwrite=true"), tmp_path)
    assert (tmp_path / ".wandb_id").read_text() != first


# --- permissions ------------------------------------------------------------------------------------------
def test_outputs_follow_the_umask(tmp_path, monkeypatch):
    """A group-shared umask (002) gives group-writable outputs: no 0600 file or 0700 directory."""
    from pretrainlab.compare import collect, write_report
    from pretrainlab.studies.suite import run_suite
    from tests.conftest import compose_config

    cache = tmp_path / "cache"
    monkeypatch.setenv("PRETRAINLAB_CACHE", str(cache))
    previous = os.umask(0o002)
    try:
        run(compose_train(*QUICK), tmp_path / "run")
        cfg = compose_config(
            "glue",
            f"pretrained={tmp_path / 'run'}",
            "glue.source=synthetic",
            "glue.synthetic.scale=0.05",
            "logger=csv",
            "trainer.enable_progress_bar=false",
            "task_overrides.epochs=1",
            "task_overrides.max_seq_len=64",
        )
        run_suite(cfg, ["rte"], [0], None, dict(cfg.task_overrides))
        write_report(collect([str(tmp_path / "run")]), tmp_path / "report")
        # a fresh interpreter: a process forked from the tests' server would have the server's umask, not this one
        done = run_command(
            [sys.executable, "-m", "pretrainlab.export", str(tmp_path / "run"), str(tmp_path / "hf")], fresh=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        os.umask(previous)
    mine = [tmp_path / "run", cache, tmp_path / "report", tmp_path / "hf"]
    paths = [p for root in mine for p in [root, *root.rglob("*")] if not p.is_symlink()]
    assert any(p.name == "tokenizer.json" and cache in p.parents for p in paths)
    assert any(p.name == "results.json" or p.name == "seed0.json" for p in paths)
    wrong = {
        str(p): oct(stat.S_IMODE(p.stat().st_mode))
        for p in paths
        if stat.S_IMODE(p.stat().st_mode) & 0o060 != 0o060 and not p.name.endswith(".lock") and "wandb" not in p.parts
    }
    assert not wrong, wrong


# --- links, full disks, foreign pickles ---------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["hf", "native"])
def test_an_export_through_a_link_replaces_the_linked_folder_and_keeps_the_link(trained, tmp_path, fmt):
    other = tmp_path / "other"
    run(compose_train(*QUICK, "seed=1"), other)
    real, link = tmp_path / "real", tmp_path / "link"
    assert export_cli(str(trained), str(real), "--format", fmt, cwd=tmp_path).returncode == 0
    link.symlink_to(real)
    weights = "model.safetensors" if fmt == "hf" else "encoder.safetensors"
    first = (real / weights).read_bytes()
    out = export_cli(str(other), str(link), "--format", fmt, cwd=tmp_path)
    assert out.returncode == 0 and f"a link to {real}" in out.stdout, out.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / weights).read_bytes() != first  # the folder the link points at holds the new model
    assert (real / weights).read_bytes() == (link / weights).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_checkpoint_that_cannot_be_written_is_named_with_the_reason(tmp_path):
    """A write that fails part-way (here a file-size limit, as a full disk would) names the checkpoint,
    the reason and the free space, and leaves nothing half-written behind."""
    script = (
        "import resource, signal\n"
        "from pretrainlab.pretraining.run import run\n"
        "from tests.conftest import compose_train\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (3_000_000, 3_000_000))\n"
        f"run(compose_train(*{QUICK!r}, 'max_steps=4', 'checkpoint_every=2'), {str(tmp_path / 'run')!r})\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert f"could not write {tmp_path / 'run' / 'checkpoints'}/step=2.ckpt" in last, out.stderr[-2000:]
    assert "MiB free on its file system" in last and "enforce fail" not in last.split(":", 1)[0]
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == []


def test_a_pickled_hf_checkpoint_is_refused_with_how_to_convert_it(trained, tmp_path):
    import argparse

    from safetensors.torch import load_file

    from pretrainlab.export.hf import export_hf
    from pretrainlab.export.pretrained import load_pretrained

    hf = tmp_path / "hf"
    export_hf(trained, hf)
    state = load_file(str(hf / "model.safetensors"))
    (hf / "model.safetensors").unlink()
    torch.save({**state, "training_args": argparse.Namespace(lr=1)}, hf / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(f"hf:{hf}")
    message = str(refused.value)
    assert "pytorch_model.bin holds Python objects" in message and "it needs argparse.Namespace" in message
    assert "add_safe_globals" not in message and "convert it once to safetensors" in message
    command = message.split("\n  ", 1)[1]
    assert command.startswith("python -c ")
    subprocess.run(f"{sys.executable}{command[len('python') :]}", shell=True, check=True, cwd=tmp_path)  # as printed
    encoder = load_pretrained(f"hf:{hf}").encoder
    assert torch.equal(
        encoder.state_dict()["embeddings.word_embeddings.weight"],
        load_encoder(trained)[0].state_dict()["embeddings.word_embeddings.weight"],
    )


def test_an_export_without_its_weights_is_named_as_incomplete(tmp_path):
    """An encoder/ holding its config.json but not its weights once failed on a bare "No such file"."""
    from pretrainlab.export.native import CONFIG
    from pretrainlab.export.pretrained import encoder_identity

    export = tmp_path / "run" / "encoder"
    export.mkdir(parents=True)
    (export / CONFIG).write_text(
        json.dumps({"encoder": {"vocab_size": 10, "hidden_size": 8, "num_layers": 1, "num_heads": 1}})
    )
    with pytest.raises(
        FileNotFoundError, match=r"holds the encoder's config.json but not its weights \(encoder.safetensors\)"
    ):
        encoder_identity(str(tmp_path / "run"))


@pytest.mark.parametrize("record", ["{not json", '{"pretraining": {}}', '{"encoder": {"vocab_size": "many"}}', "[]"])
def test_a_damaged_export_record_is_named_with_its_file(tmp_path, record):
    """An encoder/config.json that is not an export record (not JSON, no encoder block, a wrong field)
    once ended in a bare KeyError or TypeError from deep inside the evaluation."""
    from pretrainlab.export.native import CONFIG, ExportError
    from pretrainlab.export.pretrained import encoder_identity

    export = tmp_path / "run" / "encoder"
    export.mkdir(parents=True)
    (export / CONFIG).write_text(record)
    with pytest.raises(ExportError, match=r"encoder/config.json: not an encoder's export record"):
        encoder_identity(str(tmp_path / "run"))


def test_reports_are_strict_json_a_value_that_is_not_a_number_is_null(tmp_path):
    """learning.json, comparison.json and intrinsic.json held the literal NaN, which strict parsers refuse."""
    from pretrainlab import atomic

    def strict_parse(text: str):
        def refuse(constant: str):
            raise ValueError(f"{constant} is not JSON")

        return json.loads(text, parse_constant=refuse)

    path = atomic.write_json(
        tmp_path / "r.json", {"acc": float("nan"), "rows": [1.5, float("inf"), {"x": -float("inf")}]}
    )
    assert strict_parse(path.read_text()) == {"acc": None, "rows": [1.5, None, {"x": None}]}
    for report in sorted((ROOT / "docs" / "results").glob("*/*.json")):
        strict_parse(report.read_text())  # every published report
