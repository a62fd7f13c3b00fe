"""Which changes to an Iceberg table no reader can tell from the table written: a Parquet
file's pages changed in place (PyIceberg writes no page checksums, and Iceberg records no
hash of a file). A case whose read differs from the original for one of these reasons is
``unchecked``, not a failure; every other difference is a finding."""

from __future__ import annotations


def unchecked_iceberg_change(name: str, original: bytes, mutated: bytes | None) -> str | None:
    """Why this change cannot be told by any reader, or None."""
    if not name.endswith(".parquet") or mutated is None:
        return None
    ends = (mutated[:4], mutated[-4:]) == (original[:4], original[-4:])
    if len(mutated) == len(original) and len(original) >= 12 and ends:
        return "Parquet pages changed in place (no checksums)"
    return None
