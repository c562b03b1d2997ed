"""The package's structure: its layers (docs/architecture.md), an import graph without a cycle,
a small root, short modules, and only :mod:`mpisparse.runtimes` asking which runtime a scheme has.

The graph is built by parsing every module with :mod:`ast` (no import
runs): module-level, function-level and ``if TYPE_CHECKING:`` imports
(an annotation's import is an import too), relative imports resolved,
``from pkg import name`` pointing to the submodule when ``name`` is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mpisparse"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _known(name: str) -> str | None:
    """``name`` or its closest enclosing module of the package."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node.level, node.module)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in MODULES else base)
            for t in targets:
                k = _known(t)
                if k is not None and k != module:
                    graph[module].add(k)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_sees_the_imports_it_should():
    g = import_graph()
    assert "mpisparse.registry" in g["mpisparse.schemes.base"]  # relative, module level
    assert "mpisparse.cli.main" in g["mpisparse.cli"]  # package __init__ to its submodule
    assert "mpisparse.schemes.cltk" not in g["mpisparse.schemes"]  # loaded by pkgutil, not an import statement
    assert "mpisparse.torch.overlap" in g["mpisparse.torch"]  # function level
    assert "mpisparse.config" in g["mpisparse.runtimes"]
    assert "mpisparse.runtimes" not in g["mpisparse.config"]


def test_the_graph_counts_type_checking_imports(tmp_path, monkeypatch):
    """An import under ``if TYPE_CHECKING:`` is an edge: a cycle through annotations is still a cycle."""
    pkg = tmp_path / "mpisparse"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("from .a import A\n")
    monkeypatch.setattr(__import__(__name__), "PKG", pkg)
    monkeypatch.setattr(__import__(__name__), "MODULES", _modules())
    g = import_graph()
    assert g["mpisparse.a"] == {"mpisparse.b"} and find_cycle(g) == ["mpisparse.a", "mpisparse.b", "mpisparse.a"]


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


#: The layers, bottom to top (docs/architecture.md): a module imports from its own layer or a lower one.
#: A name stands for the module and everything under it; the longest name that matches decides.
LAYERS = [
    ("mechanisms", ["mpisparse", "mpisparse.backend", "mpisparse.mpi", "mpisparse.results", "mpisparse.models",
                    "mpisparse.data"]),
    ("schemes", ["mpisparse.registry", "mpisparse.schemes"]),
    ("configuration", ["mpisparse.config", "mpisparse.jobs"]),
    ("library", ["mpisparse.torch"]),
    ("runtimes", ["mpisparse.runtimes", "mpisparse.train", "mpisparse.ps", "mpisparse.mp", "mpisparse.bench",
                  "mpisparse.reproduce"]),
    ("front ends", ["mpisparse.cli", "mpisparse.__main__"]),
]


def layer_of(module: str) -> int:
    best = (-1, -1)
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best[1]:
                best = (i, len(name))
    assert best[0] >= 0, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return best[0]


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower():
    g = import_graph()
    up = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                for m, ts in g.items() for t in ts if layer_of(t) > layer_of(m))
    assert not up, up


def test_layer_of_takes_the_longest_name():
    assert LAYERS[layer_of("mpisparse")][0] == "mechanisms"
    assert LAYERS[layer_of("mpisparse.torch.overlap")][0] == "library"
    assert LAYERS[layer_of("mpisparse.cli.bench")][0] == "front ends"
    assert LAYERS[layer_of("mpisparse.schemes.memory")][0] == "schemes"


#: the package's face (__init__, __main__) and what every layer shares
MAX_ROOT_MODULES = 8
MAX_LINES = 600


def test_the_root_holds_few_modules():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at mpisparse/: {root}; move each into its layer"


def test_no_module_over_600_lines():
    tools = PKG.parent / "tools"
    long = sorted(f"{p.relative_to(PKG.parent)}: {n}" for p in [*PKG.rglob("*.py"), *tools.rglob("*.py")]
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not long, f"over {MAX_LINES} lines (split by concern): {long}"


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_outside_the_cli_imports_it():
    offenders = sorted(f"{m} imports {t}" for m, ts in import_graph().items() for t in ts
                       if (t == "mpisparse.cli" or t.startswith("mpisparse.cli."))
                       and not (m == "mpisparse.cli" or m.startswith("mpisparse.cli.") or m == "mpisparse.__main__"))
    assert not offenders, offenders


def test_only_runtimes_compares_runtime_names():
    """No ``x.family`` at all, and no ``==``/``!=`` on ``x.runtime`` (a dispatch) outside mpisparse/runtimes.py.

    Checking that a value is a known runtime name (``in``) is validation, not dispatch.
    """
    offenders = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "family":
                offenders.append(f"{module}:{node.lineno}: .family")
            if (isinstance(node, ast.Compare) and module != "mpisparse.runtimes"
                    and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)):
                for side in [node.left, *node.comparators]:
                    if isinstance(side, ast.Attribute) and side.attr == "runtime":
                        offenders.append(f"{module}:{node.lineno}: compares .runtime")
    assert not offenders, offenders


def _compared_names(source: str):
    """``(line, dotted name)`` of each operand of ``==``/``!=`` in the code (strings and comments left out)."""
    import io
    import keyword
    import tokenize

    def operand(tok) -> bool:
        return (tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)) or tok.string == "."

    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER)]
    for i, t in enumerate(toks):
        if t.string not in ("==", "!="):
            continue
        j = i + 1
        while j < len(toks) and operand(toks[j]):
            j += 1
        k = i - 1
        while k >= 0 and operand(toks[k]):
            k -= 1
        for side in (toks[i + 1:j], toks[k + 1:i]):
            if side:
                yield t.start[0], "".join(x.string for x in side)


def test_compared_names_finds_both_sides():
    found = [n for _, n in _compared_names('if "mp" == cls.runtime and a.b != 3:\n    pass\n')]
    assert found == ["cls.runtime", "a.b"]


def test_no_family_or_runtime_comparison_in_the_code_outside_runtimes():
    """The same, by reading the code's tokens (strings and comments left out): no ``x.runtime ==``, ``family !=``."""
    offenders = [f"{module}:{line}: {name}" for module, path in MODULES.items() if module != "mpisparse.runtimes"
                 for line, name in _compared_names(path.read_text())
                 if name.rpartition(".")[2] in ("family", "runtime")]
    assert not offenders, offenders
