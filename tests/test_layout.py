"""The core's folders show its flow: every import points down the ranks below, at any level
of the code (function-level imports included), so no room reaches back up.

Ranks, lowest first (a room may import its own modules and any room ranked lower):
errors, format, the source protocol (shard_source), order and store, ops, spec, meta, the
versions a followed table's dataset holds (versions), commit and maintenance, writer,
sources, then loaders and media side by side (neither imports the other: media registers
into ops and is found by name), card, the package's face.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "jvm-free" / "spark_dl_core"
RANKS = {
    "errors": 0,
    "_version": 0,
    "format": 1,
    "shard_source": 2,
    "order": 3,
    "store": 3,
    "ops": 4,
    "spec": 5,
    "meta": 6,
    "versions": 7,
    "commit": 8,
    "maintenance": 8,
    "writer": 9,
    "sources": 10,
    "tables.parquet": 11,  # Parquet read in place, typed on TableFiles: names no format
    "tables.delta": 12,
    "tables.iceberg": 12,
    "tables": 13,  # tables/kinds: the one place above the formats that names them
    "mixture": 14,
    "loaders": 15,
    "media": 15,
    "card": 16,
    "__init__": 17,
}


def _room(module: str) -> str:
    """The room of ``spark_dl_core.<module>``: its longest prefix in :data:`RANKS`."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in RANKS:
            return ".".join(parts[:i])
    raise AssertionError(f"module {module!r} is in no room of the layout: add it to RANKS")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        parts = list(path.relative_to(CORE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """``(imported core module, line)`` for every import of a core module, at any depth."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                names = [".".join([*target, a.name]) for a in node.names]
                found += [(".".join(target) or n, node.lineno) for n in names if target]
                found += [(n, node.lineno) for n in names if not target]
            elif (node.module or "").startswith("spark_dl_core."):
                found.append((node.module[len("spark_dl_core.") :], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("spark_dl_core."):
                    found.append((alias.name[len("spark_dl_core.") :], node.lineno))
    return found


def _package_face(module: str) -> bool:
    return module == "__init__"


def test_every_import_points_down() -> None:
    wrong = []
    for module, path in _modules().items():
        room = "__init__" if _package_face(module) else _room(module)
        for target, line in _imports(module, path):
            there = _room(target)
            if there == room or RANKS[there] < RANKS[room]:
                continue
            wrong.append(f"{path.relative_to(CORE)}:{line} ({room}) imports {target} ({there})")
    assert not wrong, "imports that run up or sideways:\n" + "\n".join(wrong)


def test_every_module_has_a_room_and_imports() -> None:
    """Each module of the package is placed, and each imports cleanly (a wrong relative
    import fails here on any machine, not on the first that reaches that line)."""
    has_tf = importlib.util.find_spec("tensorflow") is not None
    for module in _modules():
        if module != "__init__":
            _room(module)
        if "tf_loader" in module and not has_tf:
            continue  # the tf adapters import tensorflow at their top (CI has it)
        importlib.import_module(
            "spark_dl_core" if module == "__init__" else f"spark_dl_core.{module}"
        )


_REFERENCE = re.compile(r":(mod|func|class|meth):`[~!]?([\w.]+)`?")


@functools.cache
def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def _top_level_names(module: str) -> set[str] | None:
    """What ``module`` defines or imports at its top level, read from its source; None
    where that cannot be told from the text (an extension module, a ``__getattr__``)."""
    spec = importlib.util.find_spec(module)
    origin = (spec.origin if spec else None) or ""
    if not origin.endswith(".py"):
        return None
    names: set[str] = set()
    statements = list(ast.parse(Path(origin).read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        else:  # if / try / with blocks at the top level define names too
            for field in ("body", "orelse", "finalbody", "handlers"):
                statements += getattr(node, field, [])
    return None if "__getattr__" in names else names


def _reference_problem(target: str, role: str, package: list[str]) -> str | None:
    """Why the docstring reference ``target`` names nothing, or None. ``spark_dl_core.a.b``
    and relative ``.a.b`` (``..a.b`` one package up, as in an import) are split into the
    longest importable module and the rest; a ``:mod:`` must be all module, anything else
    must name something the module defines or imports."""
    if target.startswith("spark_dl_core."):
        parts = target.split(".")
    elif target.startswith("."):
        rest = target.lstrip(".")
        up = len(target) - len(rest) - 1
        parts = [*package[: len(package) - up], *rest.split(".")]
    else:
        return None  # a bare name: resolved by Sphinx in the module itself
    parts = [p for p in parts if p]
    known = 1
    while known < len(parts) and _is_module(".".join(parts[: known + 1])):
        known += 1
    module, rest = ".".join(parts[:known]), parts[known:]
    if not rest:
        return None
    if role == "mod":
        return f"no module {'.'.join(parts)}"
    names = _top_level_names(module)
    if names is not None and rest[0] not in names:
        return f"{module} has no {rest[0]}"
    return None


def test_docstring_references_name_real_modules() -> None:
    """A ``:mod:``/``:func:``/``:class:``/``:meth:`` reference in the core names a module
    that exists (modules move between rooms; their old names must not linger in the text)."""
    wrong = []
    for module, path in _modules().items():
        own = ["spark_dl_core", *([] if module == "__init__" else module.split("."))]
        package = own if path.name == "__init__.py" else own[:-1]
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for role, target in _REFERENCE.findall(line):
                problem = _reference_problem(target, role, package)
                if problem:
                    where = f"{path.relative_to(CORE)}:{number}"
                    wrong.append(f"{where} :{role}:`{target}`: {problem}")
    assert not wrong, "references to modules that do not exist:\n" + "\n".join(wrong)


def test_every_kind_of_source_derives_from_the_base_alone() -> None:
    """Each kind of source derives from the shared base, and none from another kind: the MDS
    dataset, a table read in place (the Delta and Iceberg datasets through it), a mixture."""
    from spark_dl_core.mixture.dataset import Mixture
    from spark_dl_core.sources.dataset import Dataset
    from spark_dl_core.sources.mds import MdsDataset
    from spark_dl_core.tables.parquet.in_place import InPlaceDataset

    kinds = [MdsDataset, InPlaceDataset, Mixture]
    for kind in kinds:
        assert issubclass(kind, Dataset)
        others = [o.__name__ for o in kinds if o is not kind and issubclass(kind, o)]
        assert not others, f"{kind.__name__} derives from {others}"
