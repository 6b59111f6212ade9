"""The house: no import circle between modules, and no arrow from a lower floor up to a higher one
(docs/design.md). Read from the source with ``ast``: every import, at the top of a module or inside a
function (a late import is still an arrow: it runs whenever the function does)."""

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

SRC = ROOT / "src"

# floors, lowest first: a package may import its own floor and those below, never one above
FLOORS = [
    {"pretrainlab", "config", "atomic", "tokens", "figures", "uncertainty"},
    {"runtime", "model", "optim"},
    {"data"},
    {"objectives"},
    {"export", "pretraining"},
    {"evaluation"},
    {"compare"},
    {"studies"},
    {"slot", "tools"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for f in (SRC / "pretrainlab").rglob("*.py"):
        name = ".".join(f.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, f in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pretrainlab"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("pretrainlab")}
        edges[name] = targets & modules.keys()
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pretrainlab"


def _floor(package: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if package in floor)


def test_no_module_imports_itself_through_others():
    edges = _imports(_modules())
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(target) :], target]))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_no_package_imports_a_higher_floor():
    modules = _modules()
    packages = {_package(m) for m in modules} - {"pretrainlab"}
    assert packages <= set().union(*FLOORS), f"place {sorted(packages - set().union(*FLOORS))} on a floor"
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in _imports(modules).items()
        for b in targets
        if _package(a) != "pretrainlab" and _floor(_package(b)) > _floor(_package(a))
    )
    assert not upward, "imports from a lower floor up to a higher one:\n" + "\n".join(upward)


def _design_block(section: str) -> str:
    """The first code block of docs/design.md's section ``## <section>``."""
    return (ROOT / "docs" / "design.md").read_text().split(f"## {section}", 1)[1].split("```", 2)[1]


def _design_layout() -> dict[str, set[str]]:
    """docs/design.md's layout: folder of the package ("" for its top) -> the module paths it names there."""
    lines = _design_block("Layout").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("src/pretrainlab/"))
    named: dict[str, set[str]] = {}
    folder = None
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break  # back at the repository's top (tests/, experiments/, ...)
        entry = line[2:28].strip() if not line.startswith(" " * 28) else ""
        if entry:
            folder = entry.rstrip("/") if entry.endswith("/") else ""
            if folder == "":
                named.setdefault("", set()).add(entry)
        assert folder is not None
        if folder:
            named.setdefault(folder, set())
            named[folder] |= set(re.findall(r"[\w/]+\.py|\b\w+/(?= \()", line[28:]))
    return named


def test_the_layout_in_docs_design_names_every_module_and_only_modules():
    package = SRC / "pretrainlab"
    named = _design_layout()
    top = {p.name for p in package.glob("*.py")} - {"__init__.py"}
    assert named[""] == top, f"docs/design.md's layout: top-level modules {sorted(named[''] ^ top)}"
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert set(named) - {""} == folders, f"docs/design.md's layout: folders {sorted((set(named) - {''}) ^ folders)}"
    for folder in folders:
        modules = {
            str(p.relative_to(package / folder))
            for p in (package / folder).rglob("*.py")
            if p.name != "__init__.py" or p.parent != package / folder
        }
        modules = {m.replace("/__init__.py", "/") for m in modules}
        listed = named[folder]
        assert listed == modules, (
            f"docs/design.md's layout of {folder}/: missing {sorted(modules - listed)}, not modules {sorted(listed - modules)}"
        )


def test_the_floors_in_docs_design_are_the_floors_this_test_checks():
    """docs/design.md draws the floors, highest first, one line each: its packages, then what they hold."""
    drawn = [set(re.split(r"\s{3,}", line.strip())[0].split()) for line in _design_block("Floors").strip().splitlines()]
    checked = [floor - {"pretrainlab"} for floor in FLOORS]
    assert drawn[::-1] == checked, f"docs/design.md's floors, lowest first: {drawn[::-1]}; the test's: {checked}"


@pytest.mark.parametrize(
    "section, module, cls",
    [("The objective plugin contract", "pretrainlab.objectives.base", "Objective"),
     ("The evaluation plugin contract", "pretrainlab.evaluation.base", "Evaluation")],
)  # fmt: skip
def test_the_plugin_contracts_in_docs_design_have_the_code_s_signatures(section, module, cls):
    """Every method a contract block of docs/design.md names exists on its base class with those parameters."""
    import importlib
    import inspect

    base = getattr(importlib.import_module(module), cls)
    drawn = re.findall(r"def (\w+)\((?:self|cls)((?:, [\w=: .\[\]|]+)*)\)", _design_block(section))
    assert len(drawn) >= 4, drawn
    for name, params in drawn:
        method = getattr(base, name, None)
        assert callable(method), f"docs/design.md names {cls}.{name}, which does not exist"
        code = [p for p in inspect.signature(method).parameters if p not in ("self", "cls")]
        named = [p.split("=")[0].split(":")[0].strip() for p in params.split(", ") if p]
        assert named == code, f"docs/design.md: {cls}.{name}({', '.join(named)}); the code: ({', '.join(code)})"
