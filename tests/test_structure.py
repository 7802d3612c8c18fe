"""The package's structure rules, checked on the source with ``ast`` (nothing is imported):

1. no import cycle between vlmspec_cli modules, nor between its packages (every module
   ``vlmspec_cli.X.Y…`` counted as ``vlmspec_cli.X``; a top-level module is its own node;
   a package's ``__init__`` importing its own submodules is no edge);
2. the runtime (vlmspec_cli/runtime/) imports nothing from drafters/, tasks/, the CLI
   (cli*.py), ui.py or the zoo's training code;
3. no module over MAX_MODULE_LINES lines;
4. no function over MAX_FUNCTION_LINES lines (from its ``def`` line to its last line);
5. no module outside the methods' package (vlmspec_cli/drafters/) compares a method's
   name (``p.method == "tree"``, ``probe.method in ("chain", "tabed")``): what differs
   between methods is declared by each method (drafters/base.py), so a new method is one
   new file;
6. the runtime never reads a session: no runtime function takes a parameter named
   ``session`` (what it needs of one is passed in: models, readers, settings);
7. floor 1 (vlmspec_cli/fileio.py: atomic writes, fsync, same-file) imports nothing from
   the package, and every writer takes those from it: nothing else defines them;
8. a round goes one way (runtime/round/engine.py ``step``): the engine calls the drafter and the
   proposal, never the reverse; no function of the methods' package or of the proposal
   modules (runtime/round/draft.py, runtime/round/tree.py) takes a parameter named ``engine``;
9. the zoo (vlmspec_cli/zoo/: the tinyworld models' training code) is imported only by
   the zoo itself and by ``zoo:`` name resolution (runtime/models/loading.py, which maps a name
   to its packaged folder): no command, task or method depends on training code;
10. one drafter protocol: every class of the methods' package that proposes (defines
   ``propose`` or ``propose_rows``) derives from ``DraftingMethod``: no second hierarchy
   for batches (as ``BatchDrafter`` was); the engine's one round serves 1..B rows;
11. no vlmspec state stashed on other objects: outside the zoo, no module assigns an
   attribute whose name starts with ``_`` to anything but ``self`` or ``cls``
   (``lm._x = …``, ``tokenizer._y = …``), nor calls ``setattr`` on anything but them:
   what is kept per model or per request is a declared field of vlmspec's own objects
   (runtime/models/loading.py ``LoadedModel.memo``, a cache's ``rope_delta``). The zoo (training
   code no command imports, rule 9) builds transformers models and sets their own
   switches before saving them;
12. the method answers its γ: no module outside the methods' package and the profile's
   (vlmspec_cli/drafters/, vlmspec_cli/profile/) reads ``….drafting.gamma``; every other
   reader asks the method (``gamma(profile)``, ``round_width(profile)``), so a tree is
   sized and timed by its own shape, not a chain's γ;
13. the round on one screen: the engine's round (``SpeculativeEngine.step_rows``) is at most
   ROUND_LINES lines, and the engine module probes nothing (no ``getattr``/``hasattr``):
   what a proposal, a drafter or the round policy tells it is declared on their types;
14. runtime/ in rooms, on floors: at most RUNTIME_TOP_FILES files at its top level (the
   floor-0 data types and caches: request, stats, static_cache, threads, limits); every
   sub-package (room) has a floor in RUNTIME_FLOORS, and a module imports only its own
   room and rooms of lower floors (adapters and length on 1, fast 2, models 3, round 4).

Imports count wherever they are (module level or inside a function), absolute or
relative; ``import a.b.c`` and ``from a.b import c`` depend on the module a.b.c itself,
not on the packages above it (importing a package's submodule from its ``__init__`` is
not a cycle).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vlmspec_cli"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# What the runtime must not import (prefixes of module names).
RUNTIME = "vlmspec_cli.runtime"
RUNTIME_FORBIDDEN = (
    "vlmspec_cli.drafters", "vlmspec_cli.tasks", "vlmspec_cli.session", "vlmspec_cli.cli",
    "vlmspec_cli.ui",
    # the zoo is the tinyworld training code; ``zoo:`` names resolve in runtime/models/loading.py
    "vlmspec_cli.zoo",
)

# ---------------------------------------------------------------------------- allowlist
# Known offenders, each to be removed. Only these entries may fail a rule (empty now; the
# test below fails on an entry that no longer offends). Nothing may be added here.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()       # (importer, imported)
KNOWN_RUNTIME_IMPORTS: set[tuple[str, str]] = set()   # (runtime module, forbidden module)
KNOWN_LONG_MODULES: set[str] = set()
KNOWN_LONG_FUNCTIONS: set[str] = set()
KNOWN_METHOD_COMPARISONS: set[str] = set()            # file:line
METHODS = "drafters"                                  # the methods' package, under PACKAGE
FLOOR_ONE = "vlmspec_cli.fileio"
ZOO = "vlmspec_cli.zoo"
ZOO_NAME_RESOLUTION = {"vlmspec_cli.runtime.models.loading"}   # zoo:NAME -> its packaged folder
FLOOR_ONE_NAMES = {"atomic_write_bytes", "atomic_write_text", "fsync_dir", "same_file",
                   "_same_file", "write_all", "write_new"}


# ---------------------------------------------------------------------------- the checks
def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, name: str, is_package: bool, known) -> list[str]:
    """The modules of ``known`` that the import statement ``node`` in module ``name`` loads."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's own package, one level up per extra dot
            here = name.split(".") if is_package else name.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([base] if base else []))
        # "from pkg import sub" loads the module pkg.sub; "from mod import name" loads mod
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for target in targets:
        while target and target not in known:  # "import a.b.func"-style names: the module
            target = target.rpartition(".")[0]
        if target:
            out.append(target)
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, anywhere in its source."""
    known = modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_imported(node, name, path.name == "__init__.py", known))
        deps.discard(name)
        graph[name] = deps
    return graph


def find_cycles(graph: dict[str, set[str]], ignore: set[tuple[str, str]] = frozenset()
                ) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) per strongly connected group of modules, ignoring the
    edges in ``ignore``; [] when the graph has no cycle."""
    edges = {a: sorted(b for b in bs if (a, b) not in ignore and b in graph) for a, bs in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_cycle_in(edges, set(group)) for group in sorted(groups)]


def _cycle_in(edges: dict[str, list[str]], group: set[str]) -> list[str]:
    """A concrete cycle through the first module of a strongly connected ``group``."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first, so the cycle shown is a short one
        nxt = []
        for v in frontier:
            for w in edges[v]:
                if w == start:
                    return paths[v] + [start]
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def package_graph(graph: dict[str, set[str]], package: str = PACKAGE) -> dict[str, set[str]]:
    """``graph`` collapsed to the package's top level: every module ``package.X.Y…`` is
    ``package.X`` (a top-level module is its own node). Edges inside one node (a package's
    ``__init__`` importing its own submodules, its modules importing each other) vanish."""
    def top(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for a, bs in graph.items():
        out.setdefault(top(a), set()).update(top(b) for b in bs)
    for node, deps in out.items():
        deps.discard(node)
    return out


def forbidden_imports(graph: dict[str, set[str]], importer: str, forbidden: tuple[str, ...]
                      ) -> set[tuple[str, str]]:
    """(module, imported) for each module at or under ``importer`` that imports a module at
    or under one of the ``forbidden`` prefixes."""
    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return {(a, b) for a, bs in graph.items() if under(a, importer)
            for b in bs if any(under(b, f) for f in forbidden)}


def outside_importers(graph: dict[str, set[str]], inner: str, allowed: set[str]
                      ) -> set[tuple[str, str]]:
    """(module, imported) for each module outside ``inner`` (and not ``allowed``) that
    imports a module at or under ``inner``."""
    def under(name: str) -> bool:
        return name == inner or name.startswith(inner + ".")

    return {(a, b) for a, bs in graph.items() if not under(a) and a not in allowed
            for b in bs if under(b)}


def long_modules(root: Path, package: str, limit: int) -> dict[str, int]:
    """File (relative to ``root``) -> line count, for modules over ``limit`` lines."""
    out = {}
    for path in modules(root, package).values():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[path.relative_to(root).as_posix()] = n
    return out


def long_functions(root: Path, package: str, limit: int) -> dict[str, int]:
    """``file:function`` -> lines (``def`` line to last line, decorators not counted), for
    every function and method over ``limit`` lines, nested ones included."""
    out = {}
    for path in modules(root, package).values():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out[f"{path.relative_to(root).as_posix()}:{node.name}"] = n
    return out


def method_names(root: Path, package: str) -> set[str]:
    """The names the methods' modules give to ``@register("name")``."""
    names = set()
    for path in sorted((root / package / METHODS).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
    return names


def method_comparisons(root: Path, package: str, names: set[str]) -> dict[str, str]:
    """``file:line`` -> source, for every comparison outside the methods' package between
    something called *method* and a method's name as a literal."""
    out = {}
    for path in modules(root, package).values():
        if METHODS in path.relative_to(root / package).parts[:-1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            text = ast.unparse(node)
            literal = any(isinstance(n, ast.Constant) and n.value in names for n in ast.walk(node))
            if literal and "method" in text:
                out[f"{path.relative_to(root).as_posix()}:{node.lineno}"] = text
    return out


def session_parameters(root: Path, package: str, prefix: str,
                       param: str = "session") -> list[str]:
    """``module.function`` for every function of the ``prefix`` modules with a parameter
    named ``param`` (default ``session``)."""
    out = []
    for name, path in modules(root, package).items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                if any(a.arg == param for a in params):
                    out.append(f"{name}.{node.name}")
    return sorted(out)


def floor_one_definitions(root: Path, package: str) -> list[str]:
    """``module.name`` for every top-level function named like floor 1's defined outside it."""
    out = []
    for name, path in modules(root, package).items():
        if name == FLOOR_ONE:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            if isinstance(node, ast.FunctionDef) and node.name in FLOOR_ONE_NAMES:
                out.append(f"{name}.{node.name}")
    return sorted(out)


def foreign_assignments(root: Path, package: str, skip: tuple[str, ...] = ()) -> list[str]:
    """``file:line: source`` for every assignment of an attribute named ``_…`` to anything
    but ``self``/``cls`` (``x._a = …``, ``x._a += …``, in tuple targets too) and every
    ``setattr(x, …)`` with ``x`` not ``self``/``cls``, in the modules not under ``skip``."""
    def own(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in ("self", "cls")

    out = []
    for name, path in modules(root, package).items():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            found = [t for target in targets for t in ast.walk(target)
                     if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                     and t.attr.startswith("_") and not own(t.value)]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "setattr" and node.args and not own(node.args[0])):
                found.append(node)
            out += [f"{path.relative_to(root).as_posix()}:{t.lineno}: {ast.unparse(t)}"
                    for t in found]
    return sorted(out)


GAMMA_READERS = ("drafters", "profile")   # packages under PACKAGE that may read drafting.gamma


def gamma_reads(root: Path, package: str, allowed: tuple[str, ...] = GAMMA_READERS) -> list[str]:
    """``file:line`` of every ``X.drafting.gamma`` read outside the ``allowed`` packages."""
    out = []
    for path in modules(root, package).values():
        if path.relative_to(root / package).parts[0] in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr == "gamma"
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "drafting"):
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return sorted(out)


def _listing(items) -> str:
    return "\n  " + "\n  ".join(items)


# ---------------------------------------------------------------------------- the package
@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, PACKAGE)


def test_no_import_cycles(graph):
    cycles = find_cycles(graph, ignore=KNOWN_CYCLE_EDGES)
    assert not cycles, "import cycles in vlmspec_cli:" + _listing(" -> ".join(c) for c in cycles)


def test_no_import_cycles_between_packages(graph):
    cycles = find_cycles(package_graph(graph))
    assert not cycles, ("import cycles between vlmspec_cli's packages (move what both need "
                        "down to where both can import it):"
                        + _listing(" -> ".join(c) for c in cycles))


def test_runtime_imports_no_drafters_tasks_cli_ui_or_zoo(graph):
    found = forbidden_imports(graph, RUNTIME, RUNTIME_FORBIDDEN) - KNOWN_RUNTIME_IMPORTS
    assert not found, ("the runtime imports what it must not:"
                       + _listing(f"{a} imports {b}" for a, b in sorted(found)))


def test_only_the_zoo_and_zoo_name_resolution_import_the_zoo(graph):
    found = outside_importers(graph, ZOO, ZOO_NAME_RESOLUTION)
    assert not found, ("the zoo (training code) imported outside it:"
                       + _listing(f"{a} imports {b}" for a, b in sorted(found)))


def test_no_module_over_the_limit():
    found = {k: v for k, v in long_modules(ROOT, PACKAGE, MAX_MODULE_LINES).items()
             if k not in KNOWN_LONG_MODULES}
    assert not found, (f"modules over {MAX_MODULE_LINES} lines:"
                       + _listing(f"{k}: {v} lines" for k, v in sorted(found.items())))


def test_no_function_over_the_limit():
    found = {k: v for k, v in long_functions(ROOT, PACKAGE, MAX_FUNCTION_LINES).items()
             if k not in KNOWN_LONG_FUNCTIONS}
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines:"
                       + _listing(f"{k}: {v} lines" for k, v in sorted(found.items())))


def test_no_method_name_compared_outside_the_methods_package():
    names = method_names(ROOT, PACKAGE)
    assert {"none", "chain", "tree", "tabed", "twig", "hidden", "adt"} <= names
    found = {k: v for k, v in method_comparisons(ROOT, PACKAGE, names).items()
             if k not in KNOWN_METHOD_COMPARISONS}
    assert not found, ("method names compared outside drafters/ (declare it on the method):"
                       + _listing(f"{k}: {v}" for k, v in sorted(found.items())))


def test_the_runtime_never_reads_a_session():
    found = session_parameters(ROOT, PACKAGE, RUNTIME)
    assert not found, ("runtime functions taking a session (pass what they need):"
                       + _listing(found))


ONE_WAY = ("vlmspec_cli.drafters", "vlmspec_cli.runtime.round.draft", "vlmspec_cli.runtime.round.tree")


def test_a_round_goes_one_way():
    found = [f for prefix in ONE_WAY for f in session_parameters(ROOT, PACKAGE, prefix, "engine")]
    assert not found, ("drafters or proposals calling back into the engine (the engine runs "
                       "the target forward and hands them the result):" + _listing(found))


def proposing_classes_outside(root: Path, package: str, base: str = "DraftingMethod") -> list[str]:
    """``module.Class`` for every class of the methods' package that defines ``propose`` or
    ``propose_rows`` without deriving (by name, through the package's own classes) from
    ``base``."""
    parents: dict[str, list[str]] = {}
    proposing: dict[str, str] = {}
    for path in sorted((root / package / METHODS).glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            if isinstance(node, ast.ClassDef):
                parents[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]
                if any(isinstance(f, ast.FunctionDef) and f.name in ("propose", "propose_rows")
                       for f in node.body):
                    proposing[node.name] = f"{path.stem}.{node.name}"

    def derives(name: str, seen: frozenset = frozenset()) -> bool:
        return name == base or any(p not in seen and derives(p, seen | {name})
                                   for p in parents.get(name, ()))

    return sorted(where for name, where in proposing.items() if not derives(name))


def test_one_drafter_protocol():
    found = proposing_classes_outside(ROOT, PACKAGE)
    assert not found, ("classes that propose outside the DraftingMethod protocol (declare the "
                       "method's row hooks on it instead):" + _listing(found))


def test_proposing_classes_outside_the_protocol_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        f"{METHODS}/__init__.py": "",
        f"{METHODS}/a.py": ("class DraftingMethod: pass\nclass A(DraftingMethod):\n"
                            "    def propose(self): pass\nclass B(A):\n"
                            "    def propose_rows(self): pass\n"),
        f"{METHODS}/b.py": "class Rows:\n    def propose_rows(self): pass\n",
    })
    assert proposing_classes_outside(root, "pkg") == ["b.Rows"]


def test_floor_one_stands_alone_and_is_the_only_writer(graph):
    assert graph[FLOOR_ONE] == set(), f"{FLOOR_ONE} imports {sorted(graph[FLOOR_ONE])}"
    found = floor_one_definitions(ROOT, PACKAGE)
    assert not found, ("file-writing helpers defined outside vlmspec_cli/fileio.py:"
                       + _listing(found))


def test_no_state_stashed_on_other_objects():
    found = foreign_assignments(ROOT, PACKAGE, skip=(ZOO,))
    assert not found, ("private attributes set on objects that are not the module's own (keep "
                       "such state in a declared field of a vlmspec object):" + _listing(found))


def test_only_the_methods_read_drafting_gamma():
    found = gamma_reads(ROOT, PACKAGE)
    assert not found, ("drafting.gamma read outside drafters/ and profile/ (ask the method: "
                       "gamma(profile), round_width(profile)):" + _listing(found))


def test_the_allowlist_names_only_real_offenders(graph):
    """An allowlist entry that no longer offends must go (so the list only shrinks)."""
    stale = [f"cycle edge {a} -> {b}" for a, b in sorted(KNOWN_CYCLE_EDGES)
             if b not in graph.get(a, ()) or not _reaches(graph, b, a)]
    stale += [f"runtime import {a} -> {b}" for a, b in sorted(
        KNOWN_RUNTIME_IMPORTS - forbidden_imports(graph, RUNTIME, RUNTIME_FORBIDDEN))]
    stale += [f"module {k}" for k in sorted(KNOWN_LONG_MODULES - set(
        long_modules(ROOT, PACKAGE, MAX_MODULE_LINES)))]
    stale += [f"function {k}" for k in sorted(KNOWN_LONG_FUNCTIONS - set(
        long_functions(ROOT, PACKAGE, MAX_FUNCTION_LINES)))]
    stale += [f"comparison {k}" for k in sorted(KNOWN_METHOD_COMPARISONS - set(
        method_comparisons(ROOT, PACKAGE, method_names(ROOT, PACKAGE))))]
    assert not stale, "allowlist entries that no longer offend (remove them):" + _listing(stale)


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w == goal:
                return True
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return False


# ---------------------------------------------------------------------------- the checkers
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_graph_sees_relative_absolute_and_function_level_imports(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from .sub import c\n    return c\n",
        "sub/__init__.py": "from pkg.sub.c import X\n",
        "sub/c.py": "import pkg.a\nX = 1\n",
        "sub/d.py": "from .. import a\nfrom ..sub.c import X\nimport os\n",
    })
    g = import_graph(root, "pkg")
    assert g["pkg.a"] == {"pkg.b"}
    assert g["pkg.b"] == {"pkg.sub.c"}          # imported inside a function
    assert g["pkg.sub"] == {"pkg.sub.c"}
    assert g["pkg.sub.c"] == {"pkg.a"}
    assert g["pkg.sub.d"] == {"pkg.a", "pkg.sub.c"}
    assert find_cycles(g) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    # ignoring one edge of the cycle breaks it
    assert find_cycles(g, ignore={("pkg.sub.c", "pkg.a")}) == []


def test_a_package_importing_its_own_submodules_is_no_cycle(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from pkg.x import f\n",
        "x.py": "from pkg.y import g\ndef f(): return g()\n",
        "y.py": "def g(): return 1\n",
    })
    assert find_cycles(import_graph(root, "pkg")) == []


def test_session_parameters_and_floor_one_copies_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "runtime/__init__.py": "",
        "runtime/limits.py": "def fits(session, request): pass\ndef ok(target): pass\n",
        "runtime/other.py": "class A:\n    def m(self, *, session=None): pass\n",
        "tasks.py": "def run(session): pass\ndef same_file(a, b): pass\n",
        "fileio.py": "def same_file(a, b): pass\n",
    })
    assert session_parameters(root, "pkg", "pkg.runtime") == ["pkg.runtime.limits.fits",
                                                              "pkg.runtime.other.m"]
    assert session_parameters(root, "pkg", "pkg.runtime", "target") == ["pkg.runtime.limits.ok"]
    global FLOOR_ONE
    saved, FLOOR_ONE = FLOOR_ONE, "pkg.fileio"
    try:
        assert floor_one_definitions(root, "pkg") == ["pkg.tasks.same_file"]
    finally:
        FLOOR_ONE = saved


def test_forbidden_imports_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "runtime/__init__.py": "",
        "runtime/engine.py": "def run():\n    from pkg.drafters.base import D\n",
        "runtime/ok.py": "from pkg.runtime import engine\n",
        "drafters/__init__.py": "",
        "drafters/base.py": "from pkg.runtime.engine import run\nclass D: pass\n",
    })
    g = import_graph(root, "pkg")
    assert forbidden_imports(g, "pkg.runtime", ("pkg.drafters",)) == {
        ("pkg.runtime.engine", "pkg.drafters.base")}
    assert forbidden_imports(g, "pkg.drafters", ("pkg.runtime",)) == {
        ("pkg.drafters.base", "pkg.runtime.engine")}


def test_importers_from_outside_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "zoo/__init__.py": "",
        "zoo/world.py": "from pkg.zoo import train\n",
        "zoo/train.py": "",
        "tasks.py": "def probe():\n    from pkg.zoo import world\n",
        "models.py": "import pkg.zoo\n",
        "ok.py": "import os\n",
    })
    g = import_graph(root, "pkg")
    assert outside_importers(g, "pkg.zoo", set()) == {("pkg.tasks", "pkg.zoo.world"),
                                                       ("pkg.models", "pkg.zoo")}
    assert outside_importers(g, "pkg.zoo", {"pkg.models"}) == {("pkg.tasks", "pkg.zoo.world")}


def test_long_modules_and_functions_are_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    root = _package(tmp_path, {
        "__init__.py": "",
        "long.py": f"@staticmethod\ndef f():\n{body}\nclass C:\n    def ok(self):\n        pass\n",
        "short.py": "def g():\n    return 1\n",
    })
    assert long_functions(root, "pkg", 80) == {"pkg/long.py:f": 81}  # def line + 80
    assert long_functions(root, "pkg", 81) == {}
    assert long_modules(root, "pkg", 85) == {"pkg/long.py": 86}


def test_method_comparisons_are_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "drafters").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "drafters" / "__init__.py").write_text("")
    (pkg / "drafters" / "mine.py").write_text(textwrap.dedent('''
        @register("mine")
        class Mine:
            def f(self, p):
                return p.method == "mine"          # inside the package: allowed
    '''))
    (pkg / "user.py").write_text(textwrap.dedent('''
        def f(p, probe, kind, quantize):
            a = p.method == "mine"
            b = probe.method in ("other", "mine")
            c = kind == "mine" or quantize != "none"   # not a method: not counted
            return a, b, c
    '''))
    names = method_names(tmp_path, "pkg")
    assert names == {"mine"}
    assert sorted(method_comparisons(tmp_path, "pkg", names)) == ["pkg/user.py:3", "pkg/user.py:4"]



# ---------------------------------------------------------------------------- the round
ROUND_LINES = 30
ENGINE = "vlmspec_cli.runtime.round.engine"


def function_lines(path: Path, cls: str, name: str) -> int:
    """Lines of method ``cls.name`` in ``path`` (``def`` line to its last line)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == name:
                    return f.end_lineno - f.lineno + 1
    raise AssertionError(f"{path}: no {cls}.{name}")


def probes(path: Path) -> list[str]:
    """``line: source`` of every getattr/hasattr call in ``path``."""
    return [f"{n.lineno}: {ast.unparse(n)}"
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr")]


def test_the_round_reads_on_one_screen():
    path = modules(ROOT, PACKAGE)[ENGINE]
    n = function_lines(path, "SpeculativeEngine", "step_rows")
    assert n <= ROUND_LINES, (f"SpeculativeEngine.step_rows is {n} lines (at most {ROUND_LINES}): "
                              "move bookkeeping to the round policy or the proposal types")
    found = probes(path)
    assert not found, "the engine probes for attributes (declare them):" + _listing(found)


def test_round_checks_catch_a_long_round_and_a_probe(tmp_path):
    path = tmp_path / "engine.py"
    path.write_text("class SpeculativeEngine:\n    def step_rows(self, p):\n"
                    + "        x = 1\n" * 30 + "        return getattr(p, 'dropped', None)\n")
    assert function_lines(path, "SpeculativeEngine", "step_rows") == 32
    assert probes(path) == ["33: getattr(p, 'dropped', None)"]


def test_foreign_assignments_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": ("class A:\n"
                 "    def f(self, lm, tok):\n"
                 "        self._ok = 1\n"
                 "        lm._cache = {}\n"
                 "        lm.model._x, y = 1, 2\n"
                 "        tok._n += 1\n"
                 "        lm.public = 2\n"
                 "        setattr(self, 'x', 1)\n"
                 "        setattr(lm, 'x', 1)\n"
                 "        return lm._cache\n"),
        "zoo/__init__.py": "",
        "zoo/build.py": "def f(gc):\n    gc._from_model_config = False\n",
    })
    assert foreign_assignments(root, "pkg", skip=("pkg.zoo",)) == [
        "pkg/a.py:4: lm._cache", "pkg/a.py:5: lm.model._x", "pkg/a.py:6: tok._n",
        "pkg/a.py:9: setattr(lm, 'x', 1)"]
    assert foreign_assignments(root, "pkg")[-1] == "pkg/zoo/build.py:2: gc._from_model_config"


def test_gamma_reads_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "drafters/__init__.py": "",
        "drafters/chain.py": "def gamma(p):\n    return p.drafting.gamma\n",
        "tasks.py": ("def f(p, s):\n    a = p.drafting.gamma + 1\n"
                     "    b = s.profile.drafting.gamma\n    return p.gamma, p.drafting\n"),
    })
    assert gamma_reads(root, "pkg") == ["pkg/tasks.py:2", "pkg/tasks.py:3"]


def test_package_cycles_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "session.py": "def f():\n    from pkg.tasks.space import X\n",
        "plot.py": "",
        "tasks/__init__.py": "from pkg.tasks import space\n",
        "tasks/space.py": "X = 1\n",
        "tasks/run.py": "from pkg.session import f\nfrom pkg import plot\n",
        "runtime/__init__.py": "",
        "runtime/a.py": "from pkg.runtime import b\n",
        "runtime/b.py": "",
    })
    g = import_graph(root, "pkg")
    assert find_cycles(g) == []                  # no cycle between modules
    collapsed = package_graph(g, "pkg")
    assert collapsed["pkg.tasks"] == {"pkg.session", "pkg.plot"}
    assert collapsed["pkg.runtime"] == set()     # inside one package: no edge
    assert find_cycles(collapsed) == [["pkg.session", "pkg.tasks", "pkg.session"]]


# ---------------------------------------------------------------------------- runtime's rooms
RUNTIME_TOP_FILES = 12
RUNTIME_FLOORS = {
    RUNTIME: 0,                        # its top-level modules: data types, caches, threads
    f"{RUNTIME}.adapters": 1,          # one file per model family
    f"{RUNTIME}.length": 1,            # the draft-length model (drafting.length auto)
    f"{RUNTIME}.fast": 2,              # static-cache steps, packed, compiled, ragged rows
    f"{RUNTIME}.models": 3,            # loading, weight checks, heads, the captioner
    f"{RUNTIME}.round": 4,             # the engine, proposals, verify, the round policy
}


def room_of(module: str, floors: dict[str, int]) -> str | None:
    """The room (a key of ``floors``) ``module`` lives in: the longest prefix that names a
    package of ``floors`` other than the top one, else the top one for its own modules."""
    rooms = sorted((r for r in floors if module == r or module.startswith(r + ".")),
                   key=len, reverse=True)
    return rooms[0] if rooms else None


def floor_breaches(graph: dict[str, set[str]], top: str, floors: dict[str, int]) -> list[str]:
    """``a imports b`` for each import between rooms of ``top`` that goes up or sideways
    (``b``'s floor not below ``a``'s), and ``room?`` for a sub-package with no floor."""
    out = []
    for a, bs in graph.items():
        ra = room_of(a, floors)
        if ra is None:
            continue
        if ra == top and a != top and (a.count(".") > top.count(".") + 1
                                       or _is_subpackage(a, graph)):
            out.append(f"{a}: in a room with no floor")
            continue
        for b in bs:
            rb = room_of(b, floors)
            if rb is None or rb == ra:
                continue
            if floors[rb] >= floors[ra]:
                out.append(f"{a} imports {b} (floor {floors[ra]} -> {floors[rb]})")
    return sorted(set(out))


def _is_subpackage(module: str, graph: dict[str, set[str]]) -> bool:
    """``module`` is a package: other modules live under it."""
    return any(m.startswith(module + ".") for m in graph)


def test_runtime_lives_in_rooms_on_floors(graph):
    top_files = sorted(p.name for p in (ROOT / PACKAGE / "runtime").glob("*.py"))
    assert len(top_files) <= RUNTIME_TOP_FILES, (f"runtime/ has {len(top_files)} files at its "
                                                 f"top level (at most {RUNTIME_TOP_FILES}): "
                                                 + ", ".join(top_files))
    found = floor_breaches(graph, RUNTIME, RUNTIME_FLOORS)
    assert not found, ("runtime imports that go up or sideways, or rooms with no floor:"
                       + _listing(found))


def test_floor_breaches_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "", "rt/__init__.py": "", "rt/base.py": "",
        "rt/low/__init__.py": "", "rt/low/a.py": "from pkg.rt.base import x\nfrom pkg.rt.low import b\n",
        "rt/low/b.py": "from pkg.rt.high.c import y\n",          # up a floor
        "rt/side/__init__.py": "", "rt/side/d.py": "from pkg.rt.low.a import z\n",  # sideways
        "rt/high/__init__.py": "", "rt/high/c.py": "from pkg.rt.low.a import z\n",
        "rt/attic/__init__.py": "", "rt/attic/e.py": "",               # no floor
    })
    floors = {"pkg.rt": 0, "pkg.rt.low": 1, "pkg.rt.side": 1, "pkg.rt.high": 2}
    assert floor_breaches(import_graph(root, "pkg"), "pkg.rt", floors) == [
        "pkg.rt.attic.e: in a room with no floor", "pkg.rt.attic: in a room with no floor",
        "pkg.rt.low.b imports pkg.rt.high.c (floor 1 -> 2)",
        "pkg.rt.side.d imports pkg.rt.low.a (floor 1 -> 1)"]
