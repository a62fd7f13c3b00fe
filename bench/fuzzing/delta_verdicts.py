"""Which changes to a Delta table no reader can tell from the table written: data pages
changed in place (Parquet as deltalake writes it has no page checksums, and Delta records
no hash of a data file), and commits changed into another valid log. A case whose read
differs from the original for one of these reasons is ``unchecked``, not a failure."""

from __future__ import annotations

import json
from typing import Any


def pages_only(name: str, original: bytes, mutated: bytes | None) -> bool:
    """A Delta data file whose bytes changed in place (same size, both magics intact):
    Parquet as deltalake writes it has no checksum over pages or footer to catch it."""
    if not name.endswith(".parquet") or "_delta_log/" in name or mutated is None:
        return False
    ends = (mutated[:4], mutated[-4:]) == (original[:4], original[-4:])
    return len(mutated) == len(original) and len(original) >= 12 and ends


def valid_log_change(name: str, original: bytes, mutated: bytes | None) -> str | None:
    """Why a Delta commit changed this way is still a valid log that no reader can tell
    from the one written (each changed action judged alone), or None:

    - an add lost its deletion vector (the key removed, renamed or null: readers ignore
      unknown keys, and an add without a vector is valid);
    - an inline vector's text changed to another sound vector (inline vectors have no
      CRC: it deletes other rows);
    - a whole action dropped or made an unknown action (``{}``, ``{"adc": ...}``: readers
      skip unknown actions, and a commit with one action less is valid), or the commit cut
      at a line boundary;
    - an add's partition value changed or lost its key (the value lives only in the log,
      and every reader takes a missing key as null);
    - the schema renamed a column (the files lack it: read as nulls, as a column added
      later is)."""
    if mutated is None or not name.endswith(".json") or "_delta_log/" not in name:
        return None
    before, after = _actions(original), _actions(mutated)
    if before is None or after is None:
        return None
    if len(after) < len(before) and after == before[: len(after)]:
        return "the commit lost its last actions (cut at a line boundary)"
    if len(before) != len(after):
        return None
    reasons = set()
    for a, b in zip(before, after):
        if a != b:
            why = _valid_action_change(a, b)
            if why is None:
                return None
            reasons.add(why)
    return "; ".join(sorted(reasons)) or None


_ACTIONS = {"add", "remove", "metaData", "protocol", "commitInfo", "txn", "cdc"}
_ACTIONS |= {"domainMetadata", "checkpointMetadata", "sidecar"}


def _actions(data: bytes) -> list[Any] | None:
    try:
        lines = data.decode().splitlines()
        return [json.loads(line, strict=False) for line in lines if line.strip()]
    except ValueError:
        return None


def _valid_action_change(a: Any, b: Any) -> str | None:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    if not set(b) & _ACTIONS:
        return "an action dropped or replaced by an unknown one (readers skip it)"
    add_a, add_b = a.get("add"), b.get("add")
    if isinstance(add_a, dict) and isinstance(add_b, dict) and "deletionVector" in add_a:
        rest_a = {k: v for k, v in add_a.items() if k != "deletionVector"}
        rest_b = {k: v for k, v in add_b.items() if k != "deletionVector"}
        dv_a, dv_b = add_a["deletionVector"], add_b.get("deletionVector")
        if dv_b is None and all(rest_b.get(k) == v for k, v in rest_a.items()):
            return "an add lost its deletion vector"
        if rest_a == rest_b and _sound_inline(dv_a, dv_b):
            return "an inline vector changed to another sound one"
    if isinstance(add_a, dict) and isinstance(add_b, dict):
        parts_a, parts_b = add_a.get("partitionValues"), add_b.get("partitionValues")
        others_a = {k: v for k, v in add_a.items() if k != "partitionValues"}
        if (
            isinstance(parts_a, dict)
            and isinstance(parts_b, dict)
            and others_a == {k: v for k, v in add_b.items() if k != "partitionValues"}
            and set(parts_b) <= set(parts_a)
        ):  # a partition value lives only in the log; a missing key reads as null
            return "an add's partition value changed or lost its key"
    meta_a, meta_b = a.get("metaData"), b.get("metaData")
    if isinstance(meta_a, dict) and isinstance(meta_b, dict):
        same = {k: v for k, v in meta_a.items() if k != "schemaString"}
        if same == {k: v for k, v in meta_b.items() if k != "schemaString"} and _renamed(
            meta_a.get("schemaString"), meta_b.get("schemaString")
        ):
            return "the schema renamed a column"
    return None


def _renamed(a: Any, b: Any) -> bool:
    """Schema strings ``a`` and ``b`` differ in their top-level field names only."""
    try:
        fa, fb = json.loads(a)["fields"], json.loads(b)["fields"]
    except (TypeError, ValueError, KeyError):
        return False
    strip = [{k: v for k, v in f.items() if k != "name"} for f in fa]
    return len(fa) == len(fb) and strip == [{k: v for k, v in f.items() if k != "name"} for f in fb]


def _sound_inline(a: Any, b: Any) -> bool:
    """``b`` is ``a`` with another inline text that the reader's checks accept."""
    from spark_dl_core.tables.delta.deletion_vectors import vector_problem

    if not isinstance(a, dict) or not isinstance(b, dict) or b.get("storageType") != "i":
        return False
    if {k: v for k, v in a.items() if k != "pathOrInlineDv"} != {
        k: v for k, v in b.items() if k != "pathOrInlineDv"
    }:
        return False
    return vector_problem(b, None) is None
