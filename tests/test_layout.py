"""The folders show the one-way flow of the README: every import of a hetplan module, at the top
of a file or inside a function, points to its own layer or to one before it:

  core/ (the data model) -> estimators/ -> formulations/ -> solvers/ -> simulator/ -> runtime/
  -> orchestration/ (planner, re-planning, replay, elastic runs, the CLI)

The imports are read from the source files with `ast`, so the test fails on any new edge that
points up the flow, lazy imports included."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# folder -> (layer, the package it holds)
LAYERS = {"core": (0, "hetplan"), "estimators": (1, "hetplan.estimators"), "formulations": (2, "hetplan.formulations"),
          "solvers": (3, "hetplan.solvers"), "simulator": (4, "hetplan.simulator"), "runtime": (5, "hetplan.runtime"),
          "orchestration": (6, "hetplan.orchestration")}


def package_of(name: str) -> tuple[int, str]:
    """(layer, package) of an imported module name (hetplan.x.y): the longest package of LAYERS
    it lies in (hetplan itself, the data model, when no other)."""
    best = (0, "hetplan")
    for layer, package in LAYERS.values():
        if (name == package or name.startswith(package + ".")) and len(package) > len(best[1]):
            best = (layer, package)
    return best


def layer_of_module(name: str) -> int:
    return package_of(name)[0]


def imports(path: Path) -> set[str]:
    """The hetplan names `path` imports: `import hetplan.x` as hetplan.x, `from hetplan.x import y`
    as hetplan.x.y (module or not: only the longest package prefix decides the layer)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hetplan")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hetplan"):
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_imports_point_down_the_flow():
    checked, up = 0, set()
    for folder, (layer, _) in LAYERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for name in imports(path):
                checked += 1
                if layer_of_module(name) > layer:
                    up.add((rel, package_of(name)[1]))
    assert checked > 300  # the walk found the package's imports
    assert not up, sorted(up)


@pytest.mark.parametrize("name,layer", [("hetplan.plan", 0), ("hetplan.importers.sailor", 0),
                                        ("hetplan.formulations.joint.bounds", 2), ("hetplan.simulator.sailor", 4),
                                        ("hetplan.orchestration.planner", 6), ("hetplan.runtime.pieces", 5)])
def test_module_names_map_to_their_folders_layer(name, layer):
    assert layer_of_module(name) == layer


def listed_files(package: Path) -> list[str]:
    """The files (`name.py`) and subpackages (`name/`) a package's docstring lists, in its order."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return [m.group(1) for m in re.finditer(r"^  (\w+)(?:\.py|/) ", doc, re.M)]


@pytest.mark.parametrize("folder,package", [("formulations/joint", "hetplan.formulations.joint"),
                                            ("formulations/joint/bounds", "hetplan.formulations.joint.bounds")])
def test_package_files_import_only_the_ones_listed_before_them(folder, package):
    """The joint formulation and its bounds list their files in the order data flows through them;
    each file (a subpackage's files counting as that subpackage) imports only the ones before it."""
    root = REPO / folder
    order = listed_files(root)
    on_disk = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert set(order) == on_disk - {"__init__"}, (order, sorted(on_disk))
    late = []
    for i, name in enumerate(order):
        paths = [root / f"{name}.py"] if (root / f"{name}.py").exists() else sorted((root / name).rglob("*.py"))
        for path in paths:
            for imported in imports(path):
                rest = imported[len(package) + 1:].split(".")[0] if imported.startswith(package + ".") else None
                if rest in order and order.index(rest) > i:
                    late.append((path.relative_to(REPO).as_posix(), imported))
    assert not late, late
