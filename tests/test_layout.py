"""The architecture as the folder layout promises it, checked on the source.

docs/architecture.md, "Layout", says what each package is for; this checks what it promises:

- no import cycle between distnb's modules, counting imports inside functions (a lazy import is
  still a dependency) and imports of a parent package (`import distnb` in a submodule runs
  distnb's `__init__`), leaving out `if TYPE_CHECKING:` blocks; `from P import M` depends on the
  module `P.M` where there is one, and on `P` otherwise;
- only `rank/` (and its facade `distnb/overflow.py`, and the contract's signed store, a torch
  `Store`) imports torch at module level (the kernel imports distnb cheaply; `contract.keys`,
  `records`, `judgement` stay pure); only `session/` (and the
  engine's entry point `rank/engine.py`) imports ipyparallel; only `views/` imports ipywidgets
  and matplotlib;
- modules are sized by cohesion, not folded to fit a bound: no `# fmt: skip` in distnb, and
  `MAX_LINES` only as an alarm (a module that long likely holds two jobs; a class that is one
  idea may still be long, and then says so in this test);
- the judgement (`distnb.judgement`), the contract (`distnb.contract`) and the records import
  neither the kernel's side (`session`, `magics`, `views`) nor the ranks' (`rank`): both sides
  use them; records import nothing of distnb's but other records and rank lists.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "distnb"
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import outside TYPE_CHECKING blocks."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    found.append((full if full in MODULES else child.module, top))
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, top and not inner)

    visit(ast.parse(path.read_text()), True)
    return found


def graph() -> dict[str, set[str]]:
    return {
        name: {t for t, _ in imports(path) if t in MODULES and t != name}
        for name, path in MODULES.items()
    }


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)


def heavy_imports_at_module_level(prefix: str) -> dict[str, list[str]]:
    return {
        name: [t for t, top in imports(path) if top and t.split(".")[0] == prefix]
        for name, path in MODULES.items()
    }


def test_torch_is_imported_at_module_level_only_on_ranks() -> None:
    outside = {
        name: found
        for name, found in heavy_imports_at_module_level("torch").items()
        if found and not name.startswith("distnb.rank")
    }
    # distnb.overflow is the rank-side facade that user code imports on a rank; the contract's
    # signed store is a torch `Store`, imported only where a store is at hand (lazily, in the
    # kernel)
    assert set(outside) <= {"distnb.overflow", "distnb.contract.signed"}, outside


def test_ipyparallel_only_in_session_and_widgets_only_in_views() -> None:
    for prefix, home in (
        ("ipyparallel", ("distnb.session", "distnb.rank.engine")),
        ("ipywidgets", ("distnb.views",)),
        ("matplotlib", ("distnb.views",)),
    ):
        for name, path in MODULES.items():
            if any(t.split(".")[0] == prefix for t, _ in imports(path)):
                assert name.startswith(home), f"{name} imports {prefix}"


def test_modules_stay_small() -> None:
    big = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"split these modules (over {MAX_LINES} lines): {big}"


def test_no_line_is_folded_to_fit() -> None:
    folded = [
        f"{name}:{i}"
        for name, path in MODULES.items()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]
    assert not folded, f"let ruff format these lines (no `# fmt: skip`): {folded}"


def test_judgement_and_records_are_pure() -> None:
    """The judgement, the contract and the records depend on no side: not the kernel's, not the
    ranks'."""
    sides = ("distnb.session", "distnb.magics", "distnb.views", "distnb.rank")
    for name, path in MODULES.items():
        found = {t for t, _ in imports(path) if t.startswith("distnb")}
        if name.startswith(("distnb.judgement", "distnb.contract")):
            wrong = {t for t in found if any(t == s or t.startswith(f"{s}.") for s in sides)}
            assert not wrong, f"{name} imports {wrong}: judgement and contract serve both sides"
        if name.startswith("distnb.records"):
            wrong = {
                t for t in found if t != "distnb.ranklist" and not t.startswith("distnb.records")
            }
            assert not wrong, f"{name} imports {wrong}: records import only records, rank lists"


def test_no_module_is_named_like_the_standard_librarys() -> None:
    import sys

    shadowing = sorted(
        name for name in MODULES if name.rsplit(".", 1)[-1] in sys.stdlib_module_names
    )
    assert not shadowing, f"rename these (they read as the standard library's): {shadowing}"
