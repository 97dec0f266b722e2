"""docs/architecture.md names every module of the tree, and only modules that exist; the
import-layer contract in pyproject.toml covers every subpackage; the other docs name no
module that is gone; the modules of orchestrator/ import one another in no cycle, even lazily. Reads
files only: no import of the package, no TensorFlow."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("orchestrator", "pipelines")
# A module or package path relative to the repository, as the doc names it: in a link
# (`](../orchestrator/model/artifact.py)`) or in backticks (`orchestrator/model/`).
_REPO_PATH = r"(?:orchestrator|pipelines)/(?:\w+/)*(?:\w+\.py)?"
_LINKED = re.compile(rf"\]\(\.\./({_REPO_PATH})\)")
_QUOTED = re.compile(rf"`({_REPO_PATH})`")
# In prose the doc writes modules relative to orchestrator/ (`engine/plan.py`) or to the
# repository (`pipelines/recipe_flow.py`, `tests/test_architecture.py`)
_PROSE_MODULE = re.compile(r"`((?:\w+/)*\w+\.py)(?::\w+)?`")
# In the other pages: a repository path to a module or package, not inside another path
_DOCS_PATH = re.compile(rf"(?<![\w/.$~-])({_REPO_PATH})(?![\w/])")
# Dotted module names: after `-m` / `--preload`, or starting with a subpackage's name
# (lower case: `orchestrator.X` stands for any module)
_DOTTED = re.compile(r"(?<![\w.$/-])((?:orchestrator|pipelines)(?:\.[a-z_][a-z0-9_]*)+)(?!\w)")


def _python_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if "__pycache__" not in path.parts)


def _marker_only(path: Path) -> bool:
    """An `__init__.py` holding nothing but a docstring: it only marks its package."""
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
               for node in body)


def _packages() -> list[Path]:
    return sorted({path.parent for path in _python_files() if path.name == "__init__.py"})


def _rel(path: Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    return f"{rel}/" if path.is_dir() else rel


def _doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def _named_in_doc() -> set[str]:
    text = _doc_text()
    return set(_LINKED.findall(text)) | set(_QUOTED.findall(text))


def test_architecture_names_every_module_and_package() -> None:
    named = _named_in_doc()
    wanted = {_rel(path) for path in _python_files() if not _marker_only(path)}
    missing = sorted(wanted - named)
    # a package is named by its folder, or by its `__init__.py` where that holds code
    missing += [_rel(package) for package in _packages()
                if not {_rel(package), _rel(package / "__init__.py")} & named]
    assert not missing, (
        f"docs/architecture.md does not name {missing}: add a line for each to its map "
        "(a link like [`orchestrator/x/y.py`](../orchestrator/x/y.py) in its subpackage's "
        "table; a new package gets a section)")


def test_architecture_names_only_modules_that_exist() -> None:
    gone = sorted(name for name in _named_in_doc() if not (ROOT / name).exists())
    text = _doc_text()
    for name in set(_PROSE_MODULE.findall(text)):
        if not any((base / name).is_file() for base in (ROOT / "orchestrator", ROOT)):
            gone.append(name)
    assert not gone, f"docs/architecture.md names modules that do not exist: {sorted(gone)}"


def _layers_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    linter = config["tool"]["importlinter"]
    assert set(PACKAGES) <= set(linter["root_packages"])
    layered = [c for c in linter["contracts"] if c["type"] == "layers"]
    assert len(layered) == 1, "pyproject.toml: expected one import-linter layers contract"
    return layered[0]


def _layer_names(layers: list[str]) -> list[list[str]]:
    return [[name.strip() for name in layer.split("|")] for layer in layers]


def test_layers_contract_lists_every_subpackage() -> None:
    """So that a new subpackage (or top-level module) cannot dodge the layers."""
    listed = {name for layer in _layer_names(_layers_contract()["layers"]) for name in layer}
    top = ROOT / "orchestrator"
    wanted = {"pipelines"}
    wanted |= {f"orchestrator.{path.name}" for path in top.iterdir()
               if (path / "__init__.py").is_file()}
    # __init__ is the package itself; __main__ (`python -m orchestrator`) only calls cli
    wanted |= {f"orchestrator.{path.stem}" for path in top.glob("*.py")
               if path.stem not in ("__init__", "__main__")}
    missing = sorted(wanted - listed)
    assert not missing, f"pyproject.toml's layers contract does not list {missing}"
    unknown = sorted(listed - wanted)
    assert not unknown, f"pyproject.toml's layers contract lists what does not exist: {unknown}"


def test_outside_systems_contracts_cover_every_subpackage() -> None:
    """Prefect and Dask only in flow/ and pipelines/, MLflow only in tracking/: every other
    subpackage is a source of the forbidden contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    subpackages = {f"orchestrator.{path.name}" for path in (ROOT / "orchestrator").iterdir()
                   if (path / "__init__.py").is_file()}
    sources = {frozenset(c["forbidden_modules"]): set(c["source_modules"])
               for c in contracts if c["type"] == "forbidden"}
    prefect = next(s for f, s in sources.items() if "prefect" in f)
    mlflow = next(s for f, s in sources.items() if "mlflow" in f)
    assert subpackages - {"orchestrator.flow"} <= prefect
    assert (subpackages - {"orchestrator.tracking"}) | {"pipelines"} <= mlflow
    assert any(c["type"] == "independence" and c["modules"] == ["orchestrator.stages.*"]
               for c in contracts)


def test_architecture_layers_match_the_contract() -> None:
    """The layer diagram on the page is the contract's, in the same order."""
    text = _doc_text()
    section = text.split("\n## The layers\n", 1)[1]
    block = section.split("```\n", 2)[1]
    drawn = [[name.strip() for name in line.split("|")] for line in block.splitlines()
             if line.strip()]
    contract = [[name.removeprefix("orchestrator.") for name in layer]
                for layer in _layer_names(_layers_contract()["layers"])]
    assert drawn == contract


def _resolves(dotted: str) -> bool:
    """A dotted module path (optionally ending in a name the module defines) exists."""
    parts = dotted.split(".")
    path = ROOT / parts[0]
    for i, part in enumerate(parts[1:], start=1):
        if (path / part / "__init__.py").is_file():
            path = path / part
        elif (path / f"{part}.py").is_file():
            rest = parts[i + 1:]
            return not rest or (len(rest) == 1 and re.search(
                rf"\b{re.escape(rest[0])}\b", (path / f"{part}.py").read_text()) is not None)
        else:  # a name the package defines, e.g. orchestrator.load_encrypted
            init = path / "__init__.py"
            return (i == len(parts) - 1 and init.is_file()
                    and re.search(rf"\bdef {re.escape(part)}\b|\b{re.escape(part)} =",
                                  init.read_text()) is not None)
    return True


def test_docs_name_only_modules_that_exist() -> None:
    """README.md and docs/*.md: every repository path to a module or package, and every
    dotted module path run with `-m`, `--preload` or under a subpackage, exists."""
    subpackages = {path.name for path in (ROOT / "orchestrator").iterdir()
                   if (path / "__init__.py").is_file()}
    gone: list[str] = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for name in set(_DOCS_PATH.findall(text)):
            if not (ROOT / name).exists():
                gone.append(f"{page.relative_to(ROOT)}: {name}")
        for match in _DOTTED.finditer(text):
            dotted = match.group(1).rstrip(".")
            before = text[max(0, match.start() - 10):match.start()]
            parts = dotted.split(".")
            run = before.endswith(("-m ", "--preload "))
            if (run or parts[1] in subpackages) and not _resolves(dotted):
                gone.append(f"{page.relative_to(ROOT)}: {dotted}")
    assert not gone, f"docs name modules that do not exist: {sorted(gone)}"


def _import_graph(root: Path = ROOT, package: str = "orchestrator") -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports, anywhere in its file (inside
    functions too); `from x import y` imports the module x.y where there is one, else x."""
    def name_of(path: Path) -> str:
        parts = list(path.relative_to(root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name_of(path): path for path in sorted((root / package).rglob("*.py"))
             if "__pycache__" not in path.parts}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    package_parts = name.split(".")[:None if path.name == "__init__.py" else -1]
                    anchor = package_parts[:len(package_parts) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:  # `import a.b.c` where c is a name
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:  # breadth-first from its first module back to it
        start = min(component)
        paths, frontier, found = {start: [start]}, [start], None
        while frontier and found is None:
            following = []
            for node in frontier:
                for nxt in sorted(graph[node] & component):
                    if nxt == start and found is None:
                        found = [*paths[node], start]
                    elif nxt not in paths:
                        paths[nxt] = [*paths[node], nxt]
                        following.append(nxt)
            frontier = following
        cycles.append(found or sorted(component))
    return sorted(cycles)


def test_no_import_cycle_between_modules() -> None:
    """Imports between the modules of orchestrator/ go one way, lazy ones inside functions
    included: what two modules share lives below both."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles in orchestrator/: " + "; ".join(
        " -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    """A lazy import back up, inside a function, is a cycle; one way is none."""
    package = tmp_path / "orchestrator" / "cache"
    package.mkdir(parents=True)
    for folder in (tmp_path / "orchestrator", package):
        (folder / "__init__.py").write_text("")
    (package / "store.py").write_text(
        "def open_store():\n    from orchestrator.cache.object_store import ObjectStore\n")
    (package / "object_store.py").write_text("from orchestrator.cache import store\n")
    (package / "project.py").write_text("from .store import open_store\n")
    assert _cycles(_import_graph(tmp_path)) == [
        ["orchestrator.cache.object_store", "orchestrator.cache.store",
         "orchestrator.cache.object_store"]]
    (package / "store.py").write_text("")
    assert _cycles(_import_graph(tmp_path)) == []
