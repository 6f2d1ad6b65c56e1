"""The layers of docs/operator.md's "Code layout": every module of the operator, the trainer and the client
is in one layer and in the table, imports only from its own layer and those above it (the contract above
all, no package another's), and no import, lazy ones included, makes a cycle. The operator's policies have
one shape, `policy(r: Round)` or `policy(r: Round, plan: Plan)`, and only the planner calls them: the
adapters that snapshot a round and carry its Plan out import none."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "pets_operator": ROOT / "operator" / "pets_operator",
    "pets_training": ROOT / "src" / "pets_training",
    "pets_client": ROOT / "src" / "pets_client",
    "pets_contract": ROOT / "src" / "pets_contract",
}
HEADINGS = {"pets_operator": "The operator", "pets_training": "The trainer", "pets_client": "The client"}


def _section() -> str:
    text = (ROOT / "docs" / "operator.md").read_text()
    start = text.index("## Code layout: one place for each decision")
    return text[start:text.index("\n## ", start + 1)]


def _layers(package: str) -> list[list[str]]:
    """The numbered list under the package's heading: each item's modules, in backticks, in order."""
    block = _section().split(f"{HEADINGS[package]} (`")[1].split("\n\n")[0]
    return [re.findall(r"`([\w.]+)`", line) for line in block.splitlines() if re.match(r"\d+\. ", line)]


def _layer(package: str, heading: str) -> list[str]:
    """The modules of the package's layer whose item starts with `heading`."""
    block = _section().split(f"{HEADINGS[package]} (`")[1].split("\n\n")[0]
    (line,) = [line for line in block.splitlines() if re.match(rf"\d+\. {heading}", line)]
    return re.findall(r"`([\w.]+)`", line)


def _modules(package: str) -> list[str]:
    return sorted(path.stem for path in PACKAGES[package].glob("*.py") if path.stem != "__init__")


def _imports(package: str, module: str) -> set[tuple[str, str]]:
    """(package, module) of each of our modules that ``module`` imports, anywhere in it."""
    tree = ast.parse((PACKAGES[package] / f"{module}.py").read_text())
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package if node.level else (node.module or "").split(".")[0]
            parts = (node.module or "").split(".")[0 if node.level else 1:]
            if base not in PACKAGES:
                continue
            if parts and parts[0]:
                found.add((base, parts[0]))
            else:
                found.update((base, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[0] in PACKAGES and len(names) > 1:
                    found.add((names[0], names[1]))
    return {(pkg, name) for pkg, name in found
            if (PACKAGES[pkg] / f"{name}.py").exists() and (pkg, name) != (package, module)}


@pytest.mark.parametrize("package", sorted(HEADINGS))
def test_every_module_is_in_one_layer_and_in_the_table(package: str) -> None:
    listed = [name for layer in _layers(package) for name in layer]
    assert sorted(listed) == _modules(package), "docs/operator.md's layers and the package's modules differ"
    assert len(set(listed)) == len(listed), "a module is in two layers"
    table = _section().split(f"{HEADINGS[package]}'s modules:")[1].split("'s modules:")[0]
    missing = [name for name in listed if f"`{name}.py`" not in table]
    assert not missing, f"not in the table: {missing}"


@pytest.mark.parametrize("package", sorted(HEADINGS))
def test_a_module_imports_only_its_own_layer_and_those_above_it(package: str) -> None:
    layer_of = {name: index for index, layer in enumerate(_layers(package)) for name in layer}
    wrong = []
    for module in _modules(package):
        for target_package, target in sorted(_imports(package, module)):
            if target_package == "pets_contract":
                continue
            if target_package != package:
                wrong.append(f"{module} imports {target_package}.{target}: another package")
            elif layer_of[target] > layer_of[module]:
                wrong.append(f"{module} (layer {layer_of[module] + 1}) imports {target} "
                             f"(layer {layer_of[target] + 1})")
    assert not wrong


def test_the_contract_imports_nothing_of_ours_and_no_import_makes_a_cycle() -> None:
    graph = {(package, module): _imports(package, module)
             for package in PACKAGES for module in _modules(package)}
    assert all(target[0] == "pets_contract" for target in _imports_of_package("pets_contract", graph))
    cycles = []
    state: dict[tuple[str, str], int] = {}

    def visit(node: tuple[str, str], path: list[tuple[str, str]]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles


def _imports_of_package(package: str, graph: dict[tuple[str, str], set[tuple[str, str]]]
                        ) -> set[tuple[str, str]]:
    return {target for (pkg, _), targets in graph.items() if pkg == package for target in targets}


POLICY_SHAPES = (["Round"], ["Round", "Plan"])


def test_every_policy_takes_the_round_or_the_round_and_the_plan() -> None:
    policies = _layer("pets_operator", "the policies")
    assert len(policies) > 10, policies
    wrong = []
    for module in policies:
        tree = ast.parse((PACKAGES["pets_operator"] / f"{module}.py").read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("_"):
                continue
            args = node.args
            shape = [ast.unparse(a.annotation) if a.annotation else "" for a in args.posonlyargs + args.args]
            if shape not in POLICY_SHAPES or args.vararg or args.kwonlyargs or args.kwarg:
                wrong.append(f"{module}.{node.name}({', '.join(shape)})")
    assert not wrong, "a policy's public function takes something else than (r: Round[, plan: Plan])"


@pytest.mark.parametrize("adapter", ["reconcile", "act"])
def test_snapshot_and_act_import_no_policy(adapter: str) -> None:
    policies = set(_layer("pets_operator", "the policies"))
    imported = {name for package, name in _imports("pets_operator", adapter) if package == "pets_operator"}
    assert not imported & policies, f"{adapter} decides: it imports {sorted(imported & policies)}"
