"""What ``--method``'s help says of each drafting method, read from the methods' own source
(vlmspec_cli/drafters/*.py, with ``ast``) without importing them: the methods' modules
import torch and transformers, which made ``caption --help`` take seconds.

A method is a class decorated ``@register("name")``; its ``tasks`` and ``help`` are the
literal class attributes it declares, or those of the class it derives from (in the same
package), or ``DraftingMethod``'s defaults. tests/test_method_catalogue.py checks that this
reading equals the imported registry's (``drafters.base.method_help``), so the two cannot
drift. Imports nothing of vlmspec_cli.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

DRAFTERS = Path(__file__).resolve().parent / "drafters"
_FIELDS = ("tasks", "help")
_PACKAGE = "vlmspec_cli.drafters."


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, dict]:
    """``{name: {"tasks": (...), "help": "..."}}`` in the registry's order: ``none`` first,
    then as importing the package registers them (modules by file name, a module's imports
    of its siblings first; classes by their place in the file)."""
    classes: dict[str, tuple[list[str], dict]] = {}   # class -> (bases, literal fields)
    registered: list[tuple[str, str]] = []            # (method name, class)
    trees = {p.stem: ast.parse(p.read_text(encoding="utf-8"), str(p))
             for p in sorted(DRAFTERS.glob("*.py"))}
    loaded: set[str] = set()

    def load(module: str) -> None:   # as importing it would: its sibling imports first
        if module in loaded or module not in trees:
            return
        loaded.add(module)
        for node in trees[module].body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_PACKAGE):
                load(node.module[len(_PACKAGE):])
            if isinstance(node, ast.ClassDef):
                read(node)

    def read(node: ast.ClassDef) -> None:
        fields = {}
        for stmt in node.body:
            target, value = _assignment(stmt)
            if target in _FIELDS:
                fields[target] = ast.literal_eval(value)
        classes[node.name] = ([ast.unparse(b).split(".")[-1] for b in node.bases], fields)
        for deco in node.decorator_list:
            if (isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "register"
                    and deco.args and isinstance(deco.args[0], ast.Constant)):
                registered.append((deco.args[0].value, node.name))

    load("base")          # the package's __init__ imports base first, then every module
    for module in trees:
        load(module)

    def field(cls: str, name: str):
        bases, fields = classes.get(cls, ([], {}))
        if name in fields:
            return fields[name]
        return next((v for b in bases if (v := field(b, name)) is not None), None)

    order = sorted(registered, key=lambda r: r[0] != "none")
    return {name: {"tasks": tuple(field(cls, "tasks") or ()), "help": field(cls, "help") or ""}
            for name, cls in order}


def _assignment(stmt: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
        return stmt.target.id, stmt.value
    return None, None


TASKS = ("caption", "video", "image")


def method_help(task: str | None) -> str:
    """--method's help for a command: every method of the task with what it does (no
    ``task``: a command whose profile decides the task, each method with the tasks it
    serves where it does not serve all)."""
    return format_help(catalogue(), task)


def format_help(methods: dict[str, dict], task: str | None) -> str:
    """--method's help from ``{name: {"tasks": (...), "help": "..."}}`` (this module's
    reading, or the imported registry's: drafters/base.py ``method_help``)."""
    parts = []
    for name, m in methods.items():
        if task is not None and task not in m["tasks"]:
            continue
        note = m["help"]
        if task is None and set(TASKS) - set(m["tasks"]):   # "caption and video: …"
            tasks = " and ".join(t for t in TASKS if t in m["tasks"])
            note = f"{tasks}: {note}" if note else f"{tasks} only"
        parts.append(f"{name} ({note})" if note else name)
    end = " [profile: method]." if task else "; which apply follows the profile's task [profile: method]."
    return ", ".join(parts[:-1]) + f" or {parts[-1]}" + end
