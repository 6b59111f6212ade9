"""Measured numbers in the docs, generated from the reports that measured them.

A report is a folder under ``docs/results/<name>/`` that a command wrote: a study's ``report/``
(``comparison.json``, ``learning.json``, ``cost.json``, their Markdown, and ``provenance.json``: the
command, commit, date, device and software that made it). ``publish`` copies one there; ``build``
regenerates every marked block of README.md and docs/ from them (and ``docs/index.md``, the site's
home page, from the README); ``check`` says which blocks differ
from what their reports generate (the test suite runs it, so a number edited by hand fails a test)::

    python tools/docs.py publish runs/studies/quick/report --name quick-study
    python tools/docs.py build          # make docs
    python tools/docs.py check          # exit 1 and the blocks that differ

A block in a Markdown file is a pair of comments around what is generated; a value in prose is the
same, inline::

    <!-- report: quick-study comparison -->
    ...the table, generated...
    <!-- /report -->

    pretraining took <!-- value: quick-study cost.json pretraining_s min -->9.0<!-- /value --> minutes

Blocks (:data:`BLOCKS`): ``comparison`` (the comparison's main table; ``comparison-full``: all of
comparison.md), ``differences`` (against the study's
baseline), ``orderings`` (each column's encoders from best to worst, and how many differ from the baseline), ``learning`` (each run's heads against their trivial baselines), ``cost``, ``source``
(the line that says where the numbers come from), ``table`` (a tool's ``report.json``: ``compare.measurements``), ``curves`` (an arms report's
learning curves: ``pretrainlab.studies.recipe``)
and ``about`` (what that table measured, and what the tool concluded from it, in its own words). Value formats (:data:`FORMATS`): ``min`` and
``h`` (seconds as minutes or hours), ``int``, ``pct`` (a fraction as a percentage), or a Python
format spec such as ``.3f``.

The renderers import the comparison and the studies when a block needs them: ``check`` and ``build``
read Markdown and JSON, and those imports (torch, scipy, matplotlib) take seconds to start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from pretrainlab import atomic
from pretrainlab.compare.measurements import table_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("docs") / "results"
# the files of a study's report that docs read or link; figures come along for the pages that show them
REPORT_FILES = ("*.json", "*.md", "*.csv", "*.png")

BLOCK = re.compile(
    r"(<!-- report: (?P<name>[\w.-]+) (?P<kind>[\w-]+) -->\n)(?P<body>.*?)(?P<end><!-- /report -->)", re.S
)
VALUE = re.compile(
    r"(<!-- value: (?P<name>[\w.-]+) (?P<file>[\w.-]+\.json) (?P<key>[\w.+-]+) (?P<fmt>[\w.,%+-]+) -->)"
    r"(?P<body>[^<]*)(?P<end><!-- /value -->)"
)
PROVENANCE = ("command", "date", "device")  # what a report's source line cites (and its commit, when it had one)
ANY_MARK = re.compile(r"<!-- (report|value): [^>]*-->")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)  # fenced blocks and inline code spans of Markdown


class DocsError(ValueError):
    """A marked block or value that cannot be generated: the file, the marker and why."""


def _load(report: Path, file: str) -> dict:
    path = report / file
    if not path.is_file():
        raise DocsError(f"{path} is missing: publish the report again (python tools/docs.py publish)")
    return json.loads(path.read_text(encoding="utf-8"))


def _source(report: Path, link: str) -> str:
    p = _load(report, "provenance.json")
    commit = str(p.get("commit") or "no git checkout")[:10] + (" with uncommitted changes" if p.get("dirty") else "")
    line = f"From [{report.name}]({link}): `{p['command']}`, commit {commit}, {p['date']}, {p['device']}."
    cost_file = report / "cost.json"
    if cost_file.is_file():
        from pretrainlab.studies.cost import hours  # lazily: start-up time (module docstring)

        cost = json.loads(cost_file.read_text(encoding="utf-8"))
        wall = cost.get("wall_s") or {}
        if wall:  # the study's durations; process time summed over runs at once is not one
            of = f" {cost['wall_of']}" if cost.get("wall_of") else ""
            line += " Wall-clock" + of + ": " + ", ".join(f"{p} {hours(float(s))}" for p, s in wall.items()) + "."
        else:
            line += (
                f" Process time, summed over the runs: pretraining {hours(cost['pretraining_s'])}, "
                f"evaluation {hours(cost['evaluation_s'])}."
            )
    return line


def _comparison_full(report: Path, link: str) -> str:
    from pretrainlab.compare import to_markdown  # lazily: start-up time (module docstring)

    return to_markdown(_load(report, "comparison.json"))


def _comparison(report: Path, link: str) -> str:
    """The comparison's main table alone (its first table; the report's other tables follow it)."""
    lines = _comparison_full(report, link).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def _differences(report: Path, link: str) -> str:
    from pretrainlab.compare.tables import differences_markdown  # lazily: start-up time (module docstring)

    return differences_markdown(_load(report, "comparison.json"))


def _orderings(report: Path, link: str) -> str:
    """Per column of the comparison: the encoders from best to worst, and how many differ from the
    baseline with an interval that excludes zero (in which direction)."""
    from pretrainlab.compare.tables import columns  # lazily: start-up time (module docstring)
    from pretrainlab.evaluation.base import display_name, known  # lazily: start-up time (module docstring)

    table = _load(report, "comparison.json")
    base = table.get("baseline")
    lines = []
    for column in columns(table):
        cells = table["glue"] if column == "glue" else {e: c.get(column) for e, c in table["cells"].items()}
        means = {e: c["summary"]["mean"] for e, c in cells.items() if c and c.get("summary")}
        if not means:
            continue
        ranked = sorted(means, key=lambda e: -means[e])
        line = f"- **{display_name(column) if known(column) else 'GLUE'}**: " + ", ".join(
            f"{e} {means[e]:.1f}" for e in ranked
        )
        diffs = [d[column] for e, d in (table.get("differences") or {}).items() if d.get(column)]
        if base and diffs:
            up = sum(1 for d in diffs if d["significant"] and d["mean"] > 0)
            down = sum(1 for d in diffs if d["significant"] and d["mean"] < 0)
            line += f"; against {base}: {up} of {len(diffs)} above and {down} below with an interval that excludes 0"
        lines.append(line + ".")
    return "\n".join(lines)


def _learning(report: Path, link: str) -> str:
    from pretrainlab.studies.intrinsic import learning_markdown  # lazily: start-up time (module docstring)

    return learning_markdown(_load(report, "learning.json"))


def _cost(report: Path, link: str) -> str:
    from pretrainlab.studies.cost import cost_markdown  # lazily: start-up time (module docstring)

    return cost_markdown(_load(report, "cost.json"))


def _table(report: Path, link: str) -> str:
    """A tool's report (``report.json``: its columns and rows, as ``compare.measurements`` writes them)."""
    return table_markdown(_load(report, "report.json"))


def _about(report: Path, link: str) -> str:
    """A tool report's ``about``: what its table measured and, where the tool computes it, what it
    concludes (e.g. the difference of two sides' means), as ``compare.measurements`` wrote it."""
    return str(_load(report, "report.json").get("about") or "")


def _curves(report: Path, link: str) -> str:
    """A recipe report's learning curves (``curves.csv``, ``pretrainlab.studies.recipe``): a row per arm and
    head, a column per validation step, each cell the head's held-out value / the encoder's hidden cosine."""
    import csv

    path = report / "curves.csv"
    if not path.is_file():
        raise DocsError(f"{path} is missing: publish the arms report again (python tools/docs.py publish)")
    rows = list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))
    steps = sorted({int(r["step"]) for r in rows})
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for r in rows:
        cosine = f" / {float(r['hidden_cosine']):.2f}" if r.get("hidden_cosine") else ""
        cells.setdefault((r["arm"], r["head"]), {})[int(r["step"])] = f"{float(r['value']):.3f}{cosine}"
    lines = ["| arm | head | " + " | ".join(f"{s:,}" for s in steps) + " |", "|" + "---|" * (len(steps) + 2)]
    lines += [f"| {a} | {h} | " + " | ".join(c.get(s, "") for s in steps) + " |" for (a, h), c in cells.items()]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[Path, str], str]] = {
    "source": _source,
    "comparison": _comparison,
    "comparison-full": _comparison_full,
    "differences": _differences,
    "orderings": _orderings,
    "learning": _learning,
    "cost": _cost,
    "table": _table,
    "curves": _curves,
    "about": _about,
}

FORMATS: dict[str, Callable[[float], str]] = {
    "min": lambda x: f"{x / 60:.1f}",
    "h": lambda x: f"{x / 3600:.1f}",
    "int": lambda x: f"{round(x):,}",
    "pct": lambda x: f"{100 * x:.1f}",
}


def _lookup(data, key: str, where: str):
    for part in key.split("."):
        if isinstance(data, list) and part.lstrip("-").isdigit():
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise DocsError(f"{where}: no {part!r} in the report (key {key!r})")
    return data


def _format(value, fmt: str, where: str) -> str:
    if fmt in FORMATS:
        return FORMATS[fmt](float(value))
    try:
        return format(value, fmt)
    except (ValueError, TypeError) as e:
        raise DocsError(f"{where}: format {fmt!r} does not apply to {value!r} ({e})") from None


def docs_files(root: Path) -> list[Path]:
    """The Markdown files that may hold generated blocks: README.md, CONTRIBUTING.md and docs/, the index
    of the reports (``docs/results/index.md``) included, the reports' own files not."""
    files = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file() and root / RESULTS not in f.parents[1:]]


def generate(text: str, doc: Path, root: Path) -> str:
    """``text`` (the content of ``doc``) with every block and value regenerated from its report."""

    def report_of(name: str, where: str) -> Path:
        report = root / RESULTS / name
        if not report.is_dir():
            known = sorted(p.name for p in (root / RESULTS).glob("*") if p.is_dir())
            raise DocsError(f"{where}: no report {name!r} in {RESULTS} (there are: {', '.join(known) or 'none'})")
        return report

    def block(m: re.Match) -> str:
        where = f"{doc.relative_to(root)}: <!-- report: {m['name']} {m['kind']} -->"
        if m["kind"] not in BLOCKS:
            raise DocsError(f"{where}: unknown block {m['kind']!r}; blocks: {', '.join(BLOCKS)}")
        report = report_of(m["name"], where)
        main = next((report / f for f in ("comparison.md", "report.md") if (report / f).is_file()), report)
        link = os.path.relpath(main, doc.parent)
        body = BLOCKS[m["kind"]](report, link).strip("\n")
        return f"{m.group(1)}{body}\n{m['end']}"

    def value(m: re.Match) -> str:
        where = f"{doc.relative_to(root)}: <!-- value: {m['name']} {m['file']} {m['key']} {m['fmt']} -->"
        data = _load(report_of(m["name"], where), m["file"])
        return f"{m.group(1)}{_format(_lookup(data, m['key'], where), m['fmt'], where)}{m['end']}"

    out = VALUE.sub(value, BLOCK.sub(block, text))
    prose = CODE.sub("", text)  # a marker shown as code (how to write one) is not a marker
    marks, closed = len(ANY_MARK.findall(prose)), len(BLOCK.findall(prose)) + len(VALUE.findall(prose))
    if marks != closed:
        raise DocsError(
            f"{doc.relative_to(root)}: {marks - closed} marker(s) without their closing <!-- /report --> or "
            "<!-- /value --> (or with another layout than the module's docstring shows)"
        )
    return out


HOME = Path("docs") / "index.md"
HOME_NOTE = "<!-- generated from README.md by `make docs`: edit README.md -->\n"


def site_home(readme: str, root: Path = ROOT) -> str:
    """The documentation site's home page: the README, its links made relative to ``docs/``; a link to
    a file outside ``docs/`` (CONTRIBUTING.md) becomes its name, as code."""
    docs_dir = root / "docs"

    def link(m: re.Match) -> str:
        text, target = m[1], m[2]
        if re.match(r"(https?:|mailto:|#)", target):
            return m[0]
        if target.startswith("docs/"):
            return f"[{text}]({target[len('docs/') :]})"
        path = target.split("#", 1)[0]
        return m[0] if (docs_dir / path).exists() else f"`{path}`"

    return HOME_NOTE + re.sub(r"\[([^\]]+)\]\(([^)]+)\)", link, readme)


def expected(root: Path) -> dict[Path, str]:
    """Every generated file's content as its reports and the README make it, once every report's files
    are checked against each other (:func:`verify`, once per report however many blocks cite it)."""
    for report in sorted(p for p in (root / RESULTS).glob("*") if p.is_dir()):
        verify(report)
    out = {doc: generate(doc.read_text(encoding="utf-8"), doc, root) for doc in docs_files(root) if doc != root / HOME}
    if (root / "README.md") in out and (root / "mkdocs.yml").is_file():
        out[root / HOME] = site_home(out[root / "README.md"], root)
    return out


def build(root: Path = ROOT) -> list[Path]:
    """Regenerates every marked block and value, and the site's home page; returns the files it changed."""
    changed = []
    for doc, new in expected(root).items():
        if not doc.is_file() or new != doc.read_text(encoding="utf-8"):
            doc.write_text(new, encoding="utf-8")
            changed.append(doc)
    return changed


def check(root: Path = ROOT) -> list[str]:
    """What differs from its report: one line per block or value, naming the file and the marker."""
    stale = []
    for doc, new in expected(root).items():
        text = doc.read_text(encoding="utf-8") if doc.is_file() else ""
        if new == text:
            continue
        if doc == root / HOME:
            stale.append(f"{HOME}: differs from README.md")
            continue
        for pattern in (BLOCK, VALUE):
            for was, now in zip(pattern.finditer(text), pattern.finditer(new)):
                if was["body"] != now["body"]:
                    stale.append(f"{doc.relative_to(root)}: {was.group(1).strip()} differs from its report")
    return stale


def _check_comparison(report: Path, table: dict) -> None:
    """A comparison's numbers against their own sense (every mean inside its interval) and its Markdown
    against its JSON (the table comparison.md shows is the one comparison.json makes)."""
    from pretrainlab.compare import to_markdown  # lazily: start-up time (module docstring)

    where = report / "comparison.json"
    try:
        rows = [(label, task, c) for label, cells in table["cells"].items() for task, c in cells.items()]
        rows += [(label, "glue", g) for label, g in (table.get("glue") or {}).items()]
        made = to_markdown(table)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DocsError(f"{where} is not a comparison this version of pretrainlab reads ({e})") from None
    for label, task, cell in rows:
        summary = (cell or {}).get("summary") or {}
        ci, mean = summary.get("ci"), summary.get("mean")
        if ci and mean is not None and not (ci[0] - 1e-6 <= mean <= ci[1] + 1e-6):
            raise DocsError(
                f"{where}: {label}'s {task} has a mean of {mean:.4g} outside its interval ({ci[0]:.4g}, {ci[1]:.4g}): "
                "a number was edited after the command wrote it. Publish the report as the command wrote it"
            )
    md = report / "comparison.md"
    if md.is_file() and made not in md.read_text(encoding="utf-8"):
        raise DocsError(
            f"{md} does not show the table {where.name} makes: one was edited after the command wrote them. "
            "Publish the report as the command wrote it, or run the command again"
        )


def verify(report: Path) -> None:
    """A report's files as the command wrote them, checked against each other: every JSON file parses,
    a study's comparison.csv is what its comparison.json makes, a tool's report.md holds the table its
    report.json makes. A file edited by hand (a number in comparison.json that its CSV contradicts) is
    named, not published."""
    parsed = {}
    for f in sorted(report.glob("*.json")):
        try:
            parsed[f.name] = json.loads(f.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise DocsError(f"{f} is not JSON ({e}): publish the report as the command wrote it") from None
    if "provenance.json" in parsed:
        record, provenance = parsed["provenance.json"], report / "provenance.json"
        missing = [k for k in PROVENANCE if not (isinstance(record, dict) and record.get(k))]
        if missing:
            raise DocsError(
                f"{provenance} does not say {' or '.join(missing)} (it needs {', '.join(PROVENANCE)}): the docs "
                "cite every number with the command, date and device that made it. Publish the report as the "
                "command wrote it"
            )
    comparison, table_csv = report / "comparison.json", report / "comparison.csv"
    if "comparison.json" in parsed and table_csv.is_file():
        from pretrainlab.compare.tables import to_csv  # lazily: start-up time (module docstring)

        try:
            made = to_csv(parsed["comparison.json"]).splitlines()
        except (KeyError, TypeError, ValueError) as e:
            raise DocsError(f"{comparison} is not a comparison this version of pretrainlab reads ({e})") from None
        if made != table_csv.read_text(encoding="utf-8").splitlines():
            raise DocsError(
                f"{comparison} and {table_csv.name} disagree: one was edited after the command wrote them. "
                "Publish the report as the command wrote it, or run the command again"
            )
    if "comparison.json" in parsed:
        _check_comparison(report, parsed["comparison.json"])
    if "report.json" in parsed and not (parsed["report.json"] or {}).get("rows"):
        raise DocsError(f"{report / 'report.json'} has no rows: a report that measured nothing is not published")
    tool, tool_md = report / "report.json", report / "report.md"
    if tool.is_file() and tool_md.is_file() and _table(report, "") not in tool_md.read_text(encoding="utf-8"):
        raise DocsError(
            f"{tool} and {tool_md.name} disagree: one was edited after the command wrote them. Publish the "
            "report as the command wrote it, or run the command again"
        )


def publish(report: Path, name: str, root: Path = ROOT, replace: bool = False) -> Path:
    """Copies a report folder (a study's ``report/``) to ``docs/results/<name>/``, once its files are
    checked against each other (:func:`verify`)."""
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name) or ".." in name:
        raise DocsError(
            f"--name {name!r}: a report's name is one folder name under {RESULTS}: letters, digits, '-', '_' "
            f"or '.', starting with a letter or digit (e.g. quick-study)"
        )
    if (root / RESULTS / name).exists() and not (root / RESULTS / name).is_dir():
        raise DocsError(f"--name {name!r}: {RESULTS / name} is a file of the docs, not a report: choose another name")
    if not (report / "provenance.json").is_file():
        raise DocsError(
            f"{report} has no provenance.json (the command, commit, date and device that made it): "
            "give a study's report/ folder (or a tool's --out folder) written by this version of pretrainlab"
        )
    verify(report)
    dest = root / RESULTS / name
    if dest.exists() and not replace:
        raise DocsError(f"{dest} exists: pass --replace to put this report in its place (git keeps the old one)")
    tmp = dest.with_name(f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for pattern in REPORT_FILES:
            for f in sorted(report.glob(pattern)):
                shutil.copy2(f, tmp / f.name)
        typed_commands(tmp)
        strict_json(tmp)
        if dest.exists():  # every block that cites this name must still have what it reads
            _cited_by(root, name, tmp)
        for path, found in sorted(_absolute_paths(tmp).items()):
            print(
                f"publish: {path.name} holds absolute paths of the machine that ran it: {', '.join(found[:3])}",
                file=sys.stderr,
            )
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def typed_commands(report: Path) -> None:
    """The commands a report records (provenance.json; a slot's record and its earlier starts; the line a
    tool's report.md ends with) as a user types them from the repository's root (``typed_command``)."""
    from pretrainlab.runtime.provenance import absolute_paths, machine_free, typed_command  # lazily: start-up

    provenance = report / "provenance.json"
    record = json.loads(provenance.read_text(encoding="utf-8"))
    was, record["command"] = record["command"], typed_command(record["command"])
    atomic.write_text(provenance, json.dumps(record, indent=2))

    def spans(text: str) -> str:  # a command or overrides quoted as code, then the rest of the report's words
        quoted = re.sub(r"`([^`\n]+)`", lambda m: f"`{typed_command(m[1])}`" if absolute_paths(m[1]) else m[0], text)
        return machine_free(quoted)

    md = report / "report.md"
    if md.is_file():
        atomic.write_text(md, spans(md.read_text(encoding="utf-8").replace(f"`{was}`", f"`{record['command']}`")))
    tool = report / "report.json"
    if tool.is_file():
        data = json.loads(tool.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("about"), str):
            data["about"] = spans(data["about"])
            atomic.write_text(tool, json.dumps(data))
    slot = report / "slot.json"
    if slot.is_file():
        data = json.loads(slot.read_text(encoding="utf-8"))
        for start in [data, *(data.get("earlier") or [])]:
            if isinstance(start, dict) and start.get("command"):
                start["command"] = typed_command(start["command"])
        atomic.write_json(slot, data)
        if (report / "slot.md").is_file():
            from pretrainlab.slot.report import slot_markdown  # lazily: start-up time (module docstring)

            atomic.write_text(report / "slot.md", slot_markdown(data) + "\n")


def strict_json(report: Path) -> None:
    """A report's JSON files written as strict JSON: the literal NaN (a report of older code) as null."""
    for f in sorted(report.glob("*.json")):
        text = f.read_text(encoding="utf-8")
        if re.search(r"\b(NaN|-?Infinity)\b", text):
            indent = 2 if "\n" in text.strip() else None
            atomic.write_text(f, atomic.json_text(json.loads(text), indent) + ("\n" if text.endswith("\n") else ""))


def _absolute_paths(report: Path) -> dict[Path, list[str]]:
    from pretrainlab.runtime.provenance import absolute_paths  # lazily: start-up time (module docstring)

    found = {f: absolute_paths(f.read_text(encoding="utf-8", errors="replace")) for f in sorted(report.glob("*.md"))}
    found |= {f: absolute_paths(f.read_text(encoding="utf-8")) for f in sorted(report.glob("*.json"))}
    return {f: paths for f, paths in found.items() if paths}


def _cited_by(root: Path, name: str, candidate: Path) -> None:
    """Refuse a replacement of report ``name`` by ``candidate`` that leaves a block or value citing it
    without what it reads (another kind of report under the name the README cites)."""
    for doc in docs_files(root):
        text = doc.read_text(encoding="utf-8")
        for m in [*BLOCK.finditer(text), *VALUE.finditer(text)]:
            if m["name"] != name:
                continue
            try:
                if "kind" in m.groupdict() and m.groupdict().get("kind"):
                    main = next(
                        (candidate / f for f in ("comparison.md", "report.md") if (candidate / f).is_file()), candidate
                    )
                    BLOCKS[m["kind"]](candidate, os.path.relpath(main, doc.parent))
                else:
                    _lookup(_load(candidate, m["file"]), m["key"], str(doc))
            except (DocsError, KeyError, TypeError, ValueError, OSError, StopIteration) as e:
                raise DocsError(
                    f"--replace {name}: {doc.relative_to(root)} cites {name} ({m.group(1).strip()}), and the report "
                    f"given does not have what it reads ({e}). Publish it under another name, or change the citing "
                    "block first"
                ) from None


def checkout(start: Path) -> Path:
    """The pretrainlab checkout ``start`` is in: the nearest folder from ``start`` up that holds a
    pyproject.toml naming the project pretrainlab, a README.md and docs/. The docs tool works on it,
    not on the tree the package happens to be installed from (one editable install, two checkouts)."""
    for folder in [start.resolve(), *start.resolve().parents]:
        project = folder / "pyproject.toml"
        if (
            project.is_file()
            and re.search(r'(?m)^name\s*=\s*"pretrainlab"', project.read_text(encoding="utf-8", errors="replace"))
            and (folder / "README.md").is_file()
            and (folder / "docs").is_dir()
        ):
            return folder
    raise DocsError(
        f"{start.resolve()} is not inside a pretrainlab checkout (no pyproject.toml of pretrainlab with README.md "
        "and docs/ beside it, here or above): run the docs tool in the checkout whose docs it should write, or "
        "give it with --root"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/docs.py", description=__doc__.split("\n\n")[0])
    where = argparse.ArgumentParser(add_help=False)  # --root before or after the command
    where.add_argument(
        "--root",
        type=Path,
        default=argparse.SUPPRESS,
        help="the checkout to work on (default: the one the working directory is in)",
    )
    parser.add_argument("--root", type=Path, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish", parents=[where], help="copy a study's report folder to docs/results/<name>/")
    p.add_argument("report", type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--replace", action="store_true", help="replace a report of that name")
    sub.add_parser("build", parents=[where], help="regenerate every marked block in README.md and docs/")
    sub.add_parser("check", parents=[where], help="exit 1 when a marked block differs from its report")
    args = parser.parse_args(argv)
    try:
        root = checkout(args.root if args.root is not None else Path.cwd())
        if args.cmd == "publish":
            print(f"published -> {publish(args.report, args.name, root, replace=args.replace)}")
            for f in build(root):
                print(f"regenerated {f.relative_to(root)}")
        elif args.cmd == "build":
            for f in build(root):
                print(f"regenerated {f.relative_to(root)}")
        else:
            stale = check(root)
            for line in stale:
                print(line)
            if stale:
                print("run `make docs` (python tools/docs.py build) to regenerate them")
                return 1
            print("every generated block matches its report")
    except DocsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
