"""The shape of the package (docs/design.md, "Layout"): imports run one way, down the layers,
with no circle between modules, and no module is longer than a newcomer can read at once.

Every import counts, also one inside a function: a lazy import hides a circle from Python's
loader, not from the reader who follows it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "shardsched"
MAX_LINES = 500

# Lowest first. A module may import from its own layer and the layers before it. The helpers at
# the package root (`errors`, `_fmt`, ...) are the bottom layer; `cli`, `api` and the package's
# own `__init__` (its public names) are the top one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_flags", "_fmt", "_json", "_paths", "_stdout", "errors", "core"),
    ("cost",),
    ("models",),
    ("profile", "sim"),
    ("plan",),
    ("solve",),
    ("runtime",),
    ("verify",),
    ("optim", "report", "tradeoff", "train", "gossip"),
    ("commands",),
    ("api", "cli", "__init__", "__main__"),
)
LEVEL = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports (`from x import y` names module `x.y` when it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    return LEVEL["__init__" if len(parts) == 1 else parts[1]]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_every_module_has_a_layer():
    unplaced = sorted({m.split(".")[1] for m in _modules() if "." in m} - set(LEVEL))
    assert not unplaced, f"packages in no layer of LAYERS: {unplaced}"


def test_imports_run_down_the_layers():
    upward = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts if _layer(t) > _layer(m))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_circles_of_imports():
    circles = _cycles(_graph())
    assert not circles, "modules that import each other (directly or around a circle):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_cycle_finder_finds_circles():
    # the finder itself, on a graph with a known answer: a->b->c->a and d->e->d, f alone
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "f"}, "d": {"e"}, "e": {"d"}, "f": set()}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["d", "e"]]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines (at most {MAX_LINES})"
