"""A tool's measurements as a report the docs can cite (``python tools/docs.py publish``):
``report.json`` (title, what it measured, columns and rows), ``report.md`` (the same, readable) and
``provenance.json`` (the command, commit, date and device that made it). The benchmarks, the reference
runs, the arms and the suite's time tables write them; the docs read their tables back
(:func:`table_markdown`)."""

from __future__ import annotations

import json
from pathlib import Path

from pretrainlab import atomic

REPORT = "report.json"


def table_markdown(report: dict) -> str:
    """A report's table (``report.json``'s columns and rows) in Markdown."""
    lines = ["| " + " | ".join(report["columns"]) + " |", "|" + "---|" * len(report["columns"])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in report["rows"]]
    return "\n".join(lines)


def write_table_report(out: Path, title: str, columns: list[str], rows: list[list], about: str = "") -> Path:
    """Write ``out``/report.json, report.md and provenance.json (this process's command, commit, date and
    device); returns ``out``."""
    from pretrainlab.runtime.provenance import report_provenance  # lazily: start-up time of the tools
    from pretrainlab.runtime.script import rerun_command

    out.mkdir(parents=True, exist_ok=True)
    provenance = report_provenance(rerun_command())
    atomic.write_text(out / "provenance.json", json.dumps(provenance, indent=2))
    report = {"title": title, "about": about, "columns": columns, "rows": rows}
    atomic.write_text(out / REPORT, atomic.json_text(report, None))
    md = (
        f"# {title}\n\n{about}\n\n{table_markdown(report)}\n\n"
        f"`{provenance['command']}` ({provenance['date']}, {provenance['device']})\n"
    )
    atomic.write_text(out / "report.md", md)
    return out
