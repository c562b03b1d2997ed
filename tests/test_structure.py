"""The package's structure: the import graph has no cycle, nothing below the CLI imports it,
and only :mod:`mpisparse.runtimes` asks which runtime a scheme has.

The graph is built by parsing every module with :mod:`ast` (no import
runs): module-level and function-level imports, relative imports resolved,
``from pkg import name`` pointing to the submodule when ``name`` is one.
Imports under ``if TYPE_CHECKING:`` are annotations only and are left out.
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


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


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
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
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
    assert "mpisparse.runtimes" in g["mpisparse.config"]  # function level
    assert "mpisparse.config" not in g["mpisparse.runtimes"]  # TYPE_CHECKING only


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


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
