"""The docs' measured numbers are generated from committed reports (tools/docs.py), and the
documentation site builds without warnings."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_generated_block_in_the_docs_matches_its_report():
    blocks = [m for f in docs.docs_files(ROOT) for m in docs.BLOCK.finditer(f.read_text(encoding="utf-8"))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- report: gpu-slot-s0 comparison -->" in readme and len(blocks) >= 3
    # the reports' index is built and checked like any page (its blocks were once left empty or filled by hand)
    files = docs.docs_files(ROOT)
    assert ROOT / "docs" / "results" / "index.md" in files
    assert not [f for f in files if f.parent.parent == ROOT / "docs" / "results"]  # a report's own pages are not
    assert all(m["body"].strip() for m in blocks), "a block is empty: run make docs"
    assert docs.check(ROOT) == []


def _copy(tmp_path: Path) -> Path:
    """A copy of the repository's docs and the reports they cite."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    return tmp_path


def test_a_number_edited_by_hand_in_a_generated_table_fails_the_check(tmp_path):
    root = _copy(tmp_path)
    text = (root / "README.md").read_text(encoding="utf-8")
    table = next(m for m in docs.BLOCK.finditer(text) if m["kind"] == "comparison")
    row = next(line for line in table["body"].splitlines() if line.startswith("| ") and re.search(r"\d\.\d", line))
    edited = re.sub(r"(\d)\.(\d)", lambda m: f"{(int(m[1]) + 1) % 10}.{m[2]}", row, count=1)
    (root / "README.md").write_text(text.replace(row, edited, 1), encoding="utf-8")
    assert docs.check(root) == [f"README.md: <!-- report: {table['name']} comparison --> differs from its report"]
    assert docs.build(root) == [root / "README.md"]
    assert (root / "README.md").read_text(encoding="utf-8") == text and docs.check(root) == []
    # the site's home page is the README's copy: edited by hand, it is found too
    home = root / "docs" / "index.md"
    home.write_text(home.read_text(encoding="utf-8").replace("pretrainlab", "pretrain-lab"), encoding="utf-8")
    assert docs.check(root) == ["docs/index.md: differs from README.md"]
    assert docs.build(root) == [home] and "](findings.md)" in home.read_text(encoding="utf-8")


def _report(root: Path, name: str = "r") -> Path:
    report = root / "docs" / "results" / name
    report.mkdir(parents=True)
    provenance = {
        "command": "python x.py",
        "commit": "0123456789abcdef",
        "dirty": False,
        "date": "2026-01-01 00:00 UTC",
    }
    (report / "provenance.json").write_text(json.dumps({**provenance, "device": "CPU only: 2 cores"}))
    (report / "cost.json").write_text(json.dumps({"pretraining_s": 540.0, "evaluation_s": 7200.0, "runs": [0.25, 3]}))
    return report


def test_values_in_prose_are_filled_from_the_report_and_checked(tmp_path):
    _report(tmp_path)
    doc = tmp_path / "README.md"
    doc.write_text(
        "took <!-- value: r cost.json pretraining_s min --><!-- /value --> minutes, "
        "<!-- value: r cost.json evaluation_s h -->?<!-- /value --> hours, "
        "<!-- value: r cost.json runs.0 pct --><!-- /value -->%\n"
        "<!-- report: r source -->\nold\n<!-- /report -->\n"
    )
    assert len(docs.check(tmp_path)) == 4
    docs.build(tmp_path)
    text = doc.read_text()
    assert "-->9.0<!-- /value --> minutes" in text and "-->2.0<!-- /value --> hours" in text
    assert "-->25.0<!-- /value -->%" in text
    assert (
        "From [r](docs/results/r): `python x.py`, commit 0123456789, 2026-01-01 00:00 UTC, CPU only: 2 cores." in text
    )
    assert "Process time, summed over the runs: pretraining 9.0 min, evaluation 2.00 h." in text
    assert docs.check(tmp_path) == []
    doc.write_text(text.replace("-->9.0<", "-->9.1<"))
    assert docs.check(tmp_path) == ["README.md: <!-- value: r cost.json pretraining_s min --> differs from its report"]


@pytest.mark.parametrize(
    "marker, message",
    [
        ("<!-- report: nope source -->\n<!-- /report -->", "no report 'nope' in docs/results (there are: r)"),
        ("<!-- report: r chart -->\n<!-- /report -->", "unknown block 'chart'; blocks: source, comparison"),
        ("<!-- report: r comparison -->\n<!-- /report -->", "comparison.json is missing"),
        ("<!-- value: r cost.json total_s min --><!-- /value -->", "no 'total_s' in the report"),
        ("<!-- value: r cost.json runs.0 d --><!-- /value -->", "format 'd' does not apply to 0.25"),
        ("<!-- report: r source -->\nno end", "1 marker(s) without their closing"),
    ],
)
def test_a_marker_that_cannot_be_generated_is_named(tmp_path, marker, message):
    _report(tmp_path)
    (tmp_path / "docs" / "page.md").write_text(f"# page\n\n{marker}\n")
    with pytest.raises(docs.DocsError, match=re.escape(message)) as e:
        docs.build(tmp_path)
    assert str(e.value).startswith("docs/page.md: ") or "is missing" in str(e.value)


def test_a_marker_written_as_code_is_how_to_write_one_not_a_marker(tmp_path):
    """CONTRIBUTING.md says how to write a block; shown as code, the marker is left as it is."""
    _report(tmp_path)
    shown = "Write `<!-- report: ... -->` blocks:\n\n```\n<!-- value: r cost.json x d -->\n```\n"
    (tmp_path / "CONTRIBUTING.md").write_text(shown)
    docs.build(tmp_path)
    assert (tmp_path / "CONTRIBUTING.md").read_text() == shown and docs.check(tmp_path) == []
    (tmp_path / "CONTRIBUTING.md").write_text(shown + "<!-- report: r source -->\nno end\n")
    with pytest.raises(docs.DocsError, match="CONTRIBUTING.md: 1 marker"):  # one outside code still counts
        docs.build(tmp_path)


def test_publish_copies_a_report_with_its_provenance_and_keeps_one_already_there(tmp_path):
    study = tmp_path / "study" / "report"
    study.mkdir(parents=True)
    (study / "comparison.md").write_text("| a |\n")
    with pytest.raises(docs.DocsError, match="has no provenance.json"):
        docs.publish(study, "s", root=tmp_path)
    (study / "provenance.json").write_text('{"command": "python experiments/ablate.py", "date": "2026-11-27"}')
    with pytest.raises(docs.DocsError, match="provenance.json does not say device"):  # a source line cites it
        docs.publish(study, "s", root=tmp_path)
    assert not (tmp_path / "docs").exists()
    (study / "provenance.json").write_text('{"command": "python experiments/ablate.py", "date": "d", "device": "cpu"}')
    (study / "weights.bin").write_bytes(b"x")
    dest = docs.publish(study, "s", root=tmp_path)
    assert sorted(p.name for p in dest.iterdir()) == ["comparison.md", "provenance.json"]
    (study / "comparison.md").write_text("| b |\n")
    with pytest.raises(docs.DocsError, match="exists: pass --replace"):
        docs.publish(study, "s", root=tmp_path)
    assert (dest / "comparison.md").read_text() == "| a |\n"
    docs.publish(study, "s", root=tmp_path, replace=True)
    assert (dest / "comparison.md").read_text() == "| b |\n"
    with pytest.raises(docs.DocsError, match="--name '../x'"):
        docs.publish(study, "../x", root=tmp_path)


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "x..y", ""])
def test_a_report_name_that_is_not_one_folder_is_refused_and_nothing_is_deleted(tmp_path, name):
    """`publish --name . --replace` once deleted every report in docs/results (and `..` all of docs/)."""
    study = tmp_path / "study"
    study.mkdir()
    (study / "provenance.json").write_text("{}")
    kept = tmp_path / "docs" / "results" / "kept"
    kept.mkdir(parents=True)
    (kept / "report.json").write_text("{}")
    (tmp_path / "docs" / "page.md").write_text("text")
    with pytest.raises(docs.DocsError, match="one folder name under docs/results"):
        docs.publish(study, name, root=tmp_path, replace=True)
    assert (kept / "report.json").is_file() and (tmp_path / "docs" / "page.md").is_file()


def test_the_docs_tool_works_on_the_checkout_it_runs_in_and_refuses_outside_one(tmp_path, monkeypatch, capsys):
    """With one install and two checkouts, `publish` in one once wrote into the other's docs."""
    (tmp_path / "other").mkdir()
    other = _copy(tmp_path / "other")
    (other / "pyproject.toml").write_text('[project]\nname = "pretrainlab"\n')
    readme = other / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace("| albert |", "| ALBERT |", 1), encoding="utf-8")
    monkeypatch.chdir(other / "docs")
    assert docs.main(["check"]) == 1  # this checkout's README, not the installed tree's
    assert "README.md: <!-- report: gpu-slot-s0 comparison --> differs" in capsys.readouterr().out  # the first table
    assert (ROOT / "README.md").read_text(encoding="utf-8").count("| ALBERT |") == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    monkeypatch.chdir(outside)
    assert docs.main(["build"]) == 2
    assert "is not inside a pretrainlab checkout" in capsys.readouterr().err
    assert docs.main(["--root", str(other), "build"]) == 0 and "| albert |" in readme.read_text(encoding="utf-8")
    readme.write_text(readme.read_text(encoding="utf-8").replace("| albert |", "| ALBERT |", 1), encoding="utf-8")
    assert docs.main(["build", "--root", str(other)]) == 0 and "| albert |" in readme.read_text(encoding="utf-8")


def test_a_report_whose_files_disagree_is_neither_published_nor_built(tmp_path):
    """A comparison.json edited by hand (SST-2 97.5 where its CSV says 82.5) once reached the README's
    table and orderings, and check passed; a provenance.json that is not JSON crashed the next build."""
    report = tmp_path / "report"
    shutil.copytree(ROOT / "docs" / "results" / "quick-study", report)
    table = json.loads((report / "comparison.json").read_text())
    table["cells"]["bert"]["sst2"]["score"][0] += 2.0
    (report / "comparison.json").write_text(json.dumps(table))
    with pytest.raises(docs.DocsError, match="comparison.json and comparison.csv disagree"):
        docs.publish(report, "edited", root=tmp_path)
    assert not (tmp_path / "docs" / "results" / "edited").exists()
    shutil.copy(ROOT / "docs" / "results" / "quick-study" / "comparison.json", report / "comparison.json")
    (report / "provenance.json").write_text("{not json")
    with pytest.raises(docs.DocsError, match="provenance.json is not JSON"):
        docs.publish(report, "edited", root=tmp_path)
    # one already published and edited afterwards: build and check name it
    (tmp_path / "site").mkdir()
    root = _copy(tmp_path / "site")
    published = root / "docs" / "results" / "quick-study" / "comparison.json"
    published.write_text(json.dumps(table))
    with pytest.raises(docs.DocsError, match="quick-study/comparison.json and comparison.csv disagree"):
        docs.build(root)
    tool = root / "docs" / "results" / "cpu-bench"
    data = json.loads((tool / "report.json").read_text())
    data["rows"][0][3] = "99999"
    (tool / "report.json").write_text(json.dumps(data))
    with pytest.raises(docs.DocsError, match="cpu-bench/report.json and report.md disagree"):
        docs.verify(tool)


def test_the_docs_state_no_test_counts():
    for f in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *docs.docs_files(ROOT)]:
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"\b\d[\d,]* (passed|skipped|tests,|tests in|tests run|tests pass)", text), f


def test_the_documentation_site_builds_without_warnings(tmp_path):
    """mkdocs --strict: a broken link, a missing page or an API page whose object is gone fails."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "evaluations" / "index.html").read_text()
    assert "pretrainlab.evaluation.base.Evaluation" in api
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()


def test_a_tool_reports_table_and_its_conclusion_are_generated_and_checked(tmp_path):
    """A tool's report (bench, the reference tools): its table and its ``about`` line, which carries what
    the tool concluded from the table (the SQuAD reference's difference of means), are both generated."""
    from pretrainlab.compare.measurements import write_table_report

    out = write_table_report(
        tmp_path / "docs" / "results" / "t",
        "A title",
        ["side", "F1"],
        [["ours", "7.71"], ["theirs", "8.75"]],
        about="theirs minus ours: F1 +1.04.",
    )
    assert json.loads((out / "provenance.json").read_text())["command"].startswith("python")
    doc = tmp_path / "README.md"
    doc.write_text("<!-- report: t about -->\n<!-- /report -->\n\n<!-- report: t table -->\n<!-- /report -->\n")
    docs.build(tmp_path)
    text = doc.read_text()
    assert "<!-- report: t about -->\ntheirs minus ours: F1 +1.04.\n<!-- /report -->" in text
    assert "| ours | 7.71 |" in text and docs.check(tmp_path) == []
    doc.write_text(text.replace("+1.04", "+0.04"))
    assert docs.check(tmp_path) == ["README.md: <!-- report: t about --> differs from its report"]


def test_every_entry_point_says_what_it_does_in_whole_sentences():
    """A command's docstring is its --help and its first line in the docs: its first paragraph ends a
    sentence (three entry points' stopped at "and" or a comma, the rest of the sentence lost)."""
    import ast

    scripts = sorted((ROOT / "experiments").glob("*.py")) + [ROOT / "train.py", ROOT / "finetune.py"]
    unfinished = []
    for script in scripts:
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8")))
        first = (doc or "").split("\n\n")[0].strip()
        if not first or first[-1] not in ".:)":
            unfinished.append(f"{script.name}: {first[-60:]!r}")
    assert not unfinished, unfinished


def test_a_comparison_edited_consistently_in_json_and_csv_or_beyond_sense_is_not_published(tmp_path):
    """comparison.json and .csv edited together once reached the README (a mean of 55.5 shown with the
    interval (35.2, 48.0)) while comparison.md still said 41.6, and check passed."""
    from pretrainlab.compare.tables import to_csv

    report = tmp_path / "report"
    shutil.copytree(ROOT / "docs" / "results" / "quick-study", report)
    table = json.loads((report / "comparison.json").read_text())
    cell = table["cells"]["albert"]["cola"]
    cell["score"][0] = cell["summary"]["mean"] = 55.5
    (report / "comparison.json").write_text(json.dumps(table))
    (report / "comparison.csv").write_text(to_csv(table))
    with pytest.raises(docs.DocsError, match="albert's cola has a mean of 55.5 outside its interval"):
        docs.publish(report, "edited", root=tmp_path)
    cell["summary"]["ci"] = [50.0, 60.0]
    (report / "comparison.json").write_text(json.dumps(table))
    (report / "comparison.csv").write_text(to_csv(table))
    with pytest.raises(docs.DocsError, match="comparison.md does not show the table comparison.json makes"):
        docs.publish(report, "edited", root=tmp_path)
    assert not (tmp_path / "docs" / "results" / "edited").exists()


def test_the_published_intervals_are_those_the_report_computed_and_cut_there():
    """The README cut an interval at its metric's range where the report it cites said (53.5, 125.9):
    the interval is cut where it is computed, and every rendering shows it as it is."""
    table = json.loads((ROOT / "docs" / "results" / "quick-study" / "comparison.json").read_text())
    sst2 = table["cells"]["electra"]["sst2"]["summary"]
    assert sst2["ci"][1] == 100.0 and sst2["cut"] is True
    md = (ROOT / "docs" / "results" / "quick-study" / "comparison.md").read_text()
    assert (
        "(53.5, 100.0)" in md and "125.9" not in md and "(53.5, 100.0)" in (ROOT / "docs" / "findings.md").read_text()
    )


def test_publish_refuses_an_empty_report_a_name_of_a_docs_file_and_a_replacement_its_citations_cannot_read(
    tmp_path, capsys
):
    root = _copy(tmp_path / "site") if (tmp_path / "site").mkdir() is None else None
    assert root is not None
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "provenance.json").write_text(
        '{"command": "python experiments/arms.py a.yaml", "date": "d", "device": "cpu"}'
    )
    (empty / "report.json").write_text(json.dumps({"title": "t", "about": "", "columns": ["a"], "rows": []}))
    (empty / "report.md").write_text("# t\n\n| a |\n|---|\n")
    with pytest.raises(docs.DocsError, match="report.json has no rows"):
        docs.publish(empty, "empty", root=root)
    index = root / "docs" / "results" / "index.md"
    before = index.read_text()
    with pytest.raises(docs.DocsError, match="is a file of the docs, not a report"):
        docs.publish(ROOT / "docs" / "results" / "cpu-bench", "index.md", root=root, replace=True)
    assert index.read_text() == before and not list((root / "docs" / "results").glob(".*tmp*"))
    # an arms report in the place of the study the README cites: the README could no longer be built
    with pytest.raises(docs.DocsError, match="--replace quick-study: docs/findings.md cites quick-study"):
        docs.publish(ROOT / "docs" / "results" / "gpu-recipe-arms", "quick-study", root=root, replace=True)
    assert (root / "docs" / "results" / "quick-study" / "comparison.json").is_file()
    assert docs.check(root) == []


def test_a_published_command_is_the_one_a_user_types_from_the_repository(tmp_path, capsys):
    """Reports recorded the paths of the machine that ran them (its checkout, output and temporary
    folders), and the README then showed them."""
    report = tmp_path / "report"
    report.mkdir()
    here = ROOT / "runs" / "encoder"
    command = f"python {ROOT}/src/pretrainlab/slot/__main__.py run --out /root/out data.path=/elsewhere/x/corpus {here}"
    (report / "provenance.json").write_text(json.dumps({"command": command, "date": "d", "device": "cpu"}))
    rows = [["roberta", "0.5"]]
    (report / "report.json").write_text(
        json.dumps({"title": "T", "about": f"From `{command}`.", "columns": ["a", "b"], "rows": rows})
    )
    (report / "report.md").write_text(
        f"# T\n\nFrom `{command}`.\n\n| a | b |\n|---|---|\n| roberta | 0.5 |\n\n`{command}` (d, cpu)\n"
    )
    (report / "runs.json").write_text(json.dumps({"run": "/elsewhere/x/runs/roberta-s0"}))
    dest = docs.publish(report, "typed", root=tmp_path)
    typed = "python -m pretrainlab.slot run --out '<out>' 'data.path=<data.path>' runs/encoder"
    assert json.loads((dest / "provenance.json").read_text())["command"] == typed
    assert f"`{typed}`" in (dest / "report.md").read_text() and str(ROOT) not in (dest / "report.md").read_text()
    assert typed in json.loads((dest / "report.json").read_text())["about"]
    assert (
        "runs.json holds absolute paths of the machine that ran it: /elsewhere/x/runs/roberta-s0"
        in capsys.readouterr().err
    )
    # a report of older code, with the literal NaN in its JSON: published as strict JSON
    (report / "runs.json").write_text('{"acc": NaN, "rows": [1.0, Infinity]}')
    dest = docs.publish(report, "typed", root=tmp_path, replace=True)
    assert json.loads((dest / "runs.json").read_text()) == {"acc": None, "rows": [1.0, None]}
    assert "NaN" not in (dest / "runs.json").read_text()


def test_no_generated_block_of_the_docs_carries_a_path_of_the_machine_that_made_it():
    from pretrainlab.runtime.provenance import absolute_paths

    for doc in docs.docs_files(ROOT):
        for m in docs.BLOCK.finditer(doc.read_text(encoding="utf-8")):
            assert absolute_paths(m["body"]) == [], f"{doc.relative_to(ROOT)}: {m.group(1).strip()}"
