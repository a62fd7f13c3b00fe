"""Spark plans read as text: what a Spark Connect client can see of a DataFrame's plan.

On Connect the plan's JVM objects are out of reach; the server's ``explain`` text is not.
Table scans taken as pinned reads (:mod:`spark_dl.delta_scan`, :mod:`spark_dl.iceberg_scan`)
read its sections, and accept only a plan that is one scan under aliases and selections
of plain columns (a computed or renamed column, a filter or a join would change the rows).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["explain_sections", "plain_leaf"]

_TREE = re.compile(r"^[\s|:+-]*")
_PROJECT = re.compile(r"^Project \[(.*)\]$")
_ATTRIBUTE = re.compile(r"^[^()]+#\d+L?$")


def explain_sections(df: Any) -> dict[str, str]:
    """``df``'s extended explain text by section (``"Parsed Logical Plan"``, ``"Analyzed
    Logical Plan"`` without its schema line, ``"Physical Plan"``...)."""
    text = str(df._explain_string(extended=True))
    parts = re.split(r"^== (.+?) ==$\n?", text, flags=re.MULTILINE)
    sections = dict(zip(parts[1::2], parts[2::2]))
    if "Analyzed Logical Plan" in sections:  # its first line is the output schema
        sections["Analyzed Logical Plan"] = sections["Analyzed Logical Plan"].split("\n", 1)[-1]
    return sections


def plain_leaf(analyzed: str) -> tuple[str, str] | None:
    """From an analysed plan's text: ``(leaf line, alias right above it)`` when every node
    above the one leaf is a ``SubqueryAlias`` or a ``Project`` of plain columns (the alias is
    ``""`` when a ``Project`` or nothing sits right above the leaf); else None."""
    lines = [_TREE.sub("", line).strip() for line in analyzed.strip().splitlines()]
    if not lines:
        return None
    above = ""
    for line in lines[:-1]:
        if line.startswith("SubqueryAlias "):
            above = line[len("SubqueryAlias ") :].strip()
            continue
        project = _PROJECT.match(line)
        if project is None:
            return None
        items = [i.strip() for i in project.group(1).split(", ")]
        if not all(_ATTRIBUTE.match(i) and " AS " not in i for i in items):
            return None
        above = ""
    return lines[-1], above
