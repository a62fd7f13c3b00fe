"""DatasetSpec: the declarative description of how a dataset is written.

A spec is data (pydantic, JSON round-trippable): it is recorded beside every dataset in
``spark_dl.json``, it keys caches and it feeds the fingerprint. Invalid specs fail when
constructed with a :class:`~spark_dl_core.errors.SpecError` naming the field (pydantic's
``ValidationError`` never escapes).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from .errors import SpecError, SpecValidationError
from .format.compression import parse_compression
from .format.encodings import get_encoding
from .format.hashing import check_hash_name
from .ops.transforms import Transform, resolve_write_ops

DEFAULT_SHARD_SIZE = 1 << 26  # Mosaic's default size_limit: 64 MiB
MAX_SHARD_SIZE = (1 << 32) - 1  # sample offsets are uint32

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Bytes from ``67108864``, ``"64MiB"``, ``"64mb"`` or ``"512k"``.

    Units are powers of 1024 whichever spelling is used (as Mosaic reads ``"64mb"``).
    """
    if isinstance(value, bool):
        raise SpecError("a size must be a number of bytes or a string like '64MiB'")
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value).lower())
    if not match or match.group(2) not in _UNITS:
        raise SpecError(f"cannot read {value!r} as a size; write e.g. 67108864, '64MiB', '512KiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _size(value: Any) -> Any:
    return parse_size(value) if isinstance(value, (int, str)) else value


ByteSize = Annotated[int, BeforeValidator(_size), Field(ge=1, le=MAX_SHARD_SIZE)]


NullMode = Literal["error", "mask"]
NULL_MODES: tuple[str, ...] = get_args(NullMode)  # what ``nulls=`` (and ``--nulls``) accepts


class DatasetSpec(BaseModel):
    """How to write a dataset: encodings, compression, shard size, hashes, nulls, transforms.

    ``columns`` maps column names to MDS encodings (``"jpeg"``, ``"ndarray:float32:32"``…);
    columns it does not name get an encoding inferred from their Arrow type.
    ``nulls="error"`` refuses nulls, naming the column; ``nulls="mask"`` stores each
    nullable column with nulls filled by zero/empty plus a ``<column>__isnull`` uint8
    column, and readers that produce Arrow or Spark rows restore the nulls.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: dict[str, str] = Field(default_factory=dict)
    compression: str | None = None
    shard_size: ByteSize = DEFAULT_SHARD_SIZE
    hashes: list[str] = Field(default_factory=list)
    nulls: NullMode = "error"
    transforms: list[Transform] = Field(default_factory=list)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise spec_error(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> DatasetSpec:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise spec_error(exc) from None

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> DatasetSpec:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise spec_error(exc) from None

    @field_validator("columns")
    @classmethod
    def _known_encodings(cls, columns: dict[str, str]) -> dict[str, str]:
        for name, encoding in columns.items():
            try:
                get_encoding(encoding)
            except ValueError as exc:
                raise SpecError(f"column {name!r}: {exc}") from None
        return columns

    @field_validator("compression")
    @classmethod
    def _known_compression(cls, value: str | None) -> str | None:
        parse_compression(value)
        return value or None

    @field_validator("hashes")
    @classmethod
    def _known_hashes(cls, hashes: list[str]) -> list[str]:
        for name in hashes:
            check_hash_name(name)
        if len(set(hashes)) != len(hashes):
            raise SpecError(f"hashes are listed twice: {hashes}")
        return sorted(hashes)  # Mosaic requires sorted hash lists

    def canonical(self) -> dict[str, Any]:
        """JSON-ready form used for fingerprints and cache keys (stable key order)."""
        return self.model_dump(mode="json")


NULL_SUFFIX = "__isnull"


def planned_spec(spec: DatasetSpec, schema: Any = None) -> DatasetSpec:
    """``spec`` with what its write ops record once a write is planned (a ``tokenize`` op's
    tokenizer digest and vocabulary facts), checked against the input Arrow ``schema`` when
    known. Specs without such ops come back as they are."""
    if not any(getattr(t, "op", None) == "tokenize" for t in spec.transforms):
        return spec
    return spec.model_copy(update={"transforms": resolve_write_ops(list(spec.transforms), schema)})


def spec_error(exc: ValidationError) -> SpecValidationError:
    """pydantic's validation error as a :class:`SpecError` naming each bad field."""
    problems, fields = [], []
    for err in exc.errors():
        where = ".".join(str(part) for part in err.get("loc", ())) or "spec"
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"{where}: {message}")
        fields.append(where)
    return SpecValidationError(f"invalid {exc.title}: " + "; ".join(problems), fields)
