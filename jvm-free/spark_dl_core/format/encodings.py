"""MDS column encodings: Arrow arrays in, per-sample bytes out, numpy batches back.

Names and byte layouts follow Mosaic Streaming's MDS format, so each side reads the other's
datasets. Every encoder takes a whole Arrow array and every decoder a whole batch; Python
runs per sample only where the value itself is a Python object (json, Decimal, pickle,
decoded images).
"""

from __future__ import annotations

import datetime as _dt
import json
import pickle
import re
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import EncodingError
from .buffers import (
    I64,
    U8,
    Pieces,
)
from .encoding_base import DecodeOptions as DecodeOptions
from .encoding_base import Encoding as Encoding
from .encoding_base import ImageMode as ImageMode
from .encoding_base import (
    _binary_array,
    _binary_pieces,
    _cast_checked,
    _np_values,
    _object_array,
    _pieces_from_bytes,
)
from .image_encodings import ImageEncoding, ImageListEncoding
from .ndarray import _DTYPE_CODES, NDArrayEncoding, _nested_values

# --------------------------------------------------------------------------- scalars


class ScalarEncoding(Encoding):
    """Fixed-width little-endian numbers: int8..int64, uint8..uint64, float16..64, int."""

    numeric = True

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.size = self.dtype.itemsize

    def encode(self, array: pa.Array, column: str) -> Pieces:
        t = array.type
        if not (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_boolean(t)
            or pa.types.is_temporal(t)
        ):
            raise EncodingError(column, f"Arrow type {t} cannot be stored as {self.name!r}")
        values = _cast_checked(_np_values(array), self.dtype, column)
        return Pieces(np.ascontiguousarray(values).view(U8).reshape(-1), width=self.size)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        return (
            pieces.data[: n * self.dtype.itemsize]
            .view(self.dtype)
            .astype(self.dtype.newbyteorder("="), copy=False)
        )

    def arrow_type(self) -> pa.DataType:
        return pa.from_numpy_dtype(self.dtype.newbyteorder("="))


# --------------------------------------------------------------------------- text and bytes


class BytesEncoding(Encoding):
    name = "bytes"
    strings = True

    def encode(self, array: pa.Array, column: str) -> Pieces:
        if not (
            pa.types.is_binary(array.type)
            or pa.types.is_large_binary(array.type)
            or pa.types.is_fixed_size_binary(array.type)
            or pa.types.is_string(array.type)
            or pa.types.is_large_string(array.type)
        ):
            raise EncodingError(column, f"Arrow type {array.type} cannot be stored as 'bytes'")
        return _binary_pieces(array)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        return _binary_array(pieces, False, column).to_numpy(zero_copy_only=False)

    def arrow_type(self) -> pa.DataType:
        return pa.binary()


class StrEncoding(Encoding):
    name = "str"
    strings = True

    def encode(self, array: pa.Array, column: str) -> Pieces:
        if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
            try:
                array = array.cast(pa.large_string())
                array.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise EncodingError(column, f"binary values are not valid UTF-8: {exc}") from None
        elif not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
            raise EncodingError(column, f"Arrow type {array.type} cannot be stored as 'str'")
        return _binary_pieces(array)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        return _binary_array(pieces, True, column).to_numpy(zero_copy_only=False)

    def arrow_type(self) -> pa.DataType:
        return pa.string()


class StrNumberEncoding(Encoding):
    """Numbers as their decimal text: str_int, str_float, str_decimal."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.numeric = name != "str_decimal"  # decimals read back as text

    def encode(self, array: pa.Array, column: str) -> Pieces:
        t = array.type
        if self.name == "str_int" and pa.types.is_integer(t):
            return _binary_pieces(pc.cast(array, pa.large_string()))
        if self.name == "str_float" and (pa.types.is_floating(t) or pa.types.is_integer(t)):
            texts = [repr(float(v)) for v in array.to_pylist()]
        elif self.name == "str_decimal" and (
            pa.types.is_decimal(t) or pa.types.is_integer(t) or pa.types.is_string(t)
        ):
            try:
                texts = [str(Decimal(v)) for v in array.to_pylist()]
            except ArithmeticError as exc:
                raise EncodingError(column, f"not a decimal number: {exc}") from None
        else:
            raise EncodingError(column, f"Arrow type {t} cannot be stored as {self.name!r}")
        return _pieces_from_bytes([s.encode() for s in texts])

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        text = _binary_array(pieces, True, column)
        try:
            if self.name == "str_int":
                try:
                    return pc.cast(text, pa.int64()).to_numpy()
                except pa.ArrowInvalid:  # beyond int64: keep Python ints
                    return _object_array([int(s) for s in text.to_pylist()])
            if self.name == "str_float":
                return pc.cast(text, pa.float64()).to_numpy()
            return _object_array([Decimal(s) for s in text.to_pylist()])
        except (ValueError, ArithmeticError, pa.ArrowInvalid) as exc:
            raise EncodingError(column, f"stored text is not a {self.name} value: {exc}") from None

    def arrow_type(self) -> pa.DataType:
        return {"str_int": pa.int64(), "str_float": pa.float64()}.get(self.name, pa.string())


def _jsonable(value: Any) -> Any:
    """Arrow's Python values made JSON-ready: maps (already dicts) keyed by text, decimals
    and dates as text."""
    if isinstance(value, dict):
        return {json_key_text(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def json_key_text(key: Any) -> str:
    """A map key as a JSON object key: strings as they are, other keys as their JSON text
    (``1``, ``true``, dates and decimals as text); :func:`map_key_from_text` inverts it with
    the map's recorded key type."""
    if isinstance(key, str):
        return key
    value = _jsonable(key)
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def is_binary_type(t: pa.DataType) -> bool:
    """Whether values of ``t`` are bytes (what JSON stores as text, one char per byte)."""
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def bytes_from_json_text(text: str) -> bytes:
    """Bytes stored inside a ``json`` value: :func:`_jsonable` writes each byte as the
    character of that code point (latin-1), so this gives back the very bytes.

    UnicodeEncodeError: the text holds a character above U+00FF (not written from bytes).
    """
    return text.encode("latin-1")


def map_key_from_text(text: Any, key_type: pa.DataType) -> Any:
    """The Python value of a map key stored by :func:`json_key_text` (as Arrow's
    ``as_py`` gives it); keys already typed pass through."""
    if (
        not isinstance(text, str)
        or pa.types.is_string(key_type)
        or pa.types.is_large_string(key_type)
    ):
        return text
    if is_binary_type(key_type):
        return bytes_from_json_text(text)
    if (
        pa.types.is_integer(key_type)
        or pa.types.is_floating(key_type)
        or pa.types.is_boolean(key_type)
    ):
        return json.loads(text)
    if (
        pa.types.is_struct(key_type)
        or pa.types.is_list(key_type)
        or pa.types.is_large_list(key_type)
    ):
        return json.loads(text)
    return _leaf_from_text(text, key_type)  # dates, timestamps, decimals


def _stored_as_text(t: pa.DataType) -> bool:
    """Whether :func:`_jsonable` stores values of the leaf type ``t`` as JSON text though
    they are no strings (bytes, decimals, dates, times, timestamps)."""
    return (
        is_binary_type(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_timestamp(t)
    )


def _leaf_from_text(text: str, t: pa.DataType) -> Any:
    """The Python value (as Arrow's ``as_py`` gives it) of a leaf that :func:`_jsonable`
    stored as text."""
    if is_binary_type(t):
        return bytes_from_json_text(text)
    if pa.types.is_decimal(t):
        return Decimal(text)
    if pa.types.is_time(t):  # Arrow casts no text to times
        return _dt.time.fromisoformat(text)
    return pa.array([text]).cast(t)[0].as_py()  # dates, timestamps (with their zones)


def json_loses_types(t: pa.DataType) -> bool:
    """Whether a ``json``-stored value of type ``t`` decodes to other Python types than
    Arrow's: it holds a map (JSON objects key by text) or a leaf stored as text below it."""
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_stored_as_text(f.type) or json_loses_types(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _stored_as_text(t.value_type) or json_loses_types(t.value_type)
    return False


def json_value_as_py(value: Any, t: pa.DataType, *, map_pairs: bool = False) -> Any:
    """A decoded ``json`` value of Arrow type ``t`` with the Python types JSON lost, as
    Arrow's ``as_py`` gives them: bytes, decimals, dates, times and timestamps (stored as
    text), map keys (stored as object keys). Maps are dicts, where keys that are structs or
    lists (unhashable) stay JSON text; with ``map_pairs``, lists of (key, value) pairs
    with every key typed, Arrow's input form. Values already typed pass through."""
    if value is None:
        return None
    if isinstance(value, str) and _stored_as_text(t):
        return _leaf_from_text(value, t)
    if pa.types.is_map(t):
        pairs = value.items() if isinstance(value, dict) else value  # []: an old empty map
        typed: list[tuple[Any, Any]] = []
        for text, item in pairs:
            key = map_key_from_text(text, t.key_type)
            key = json_value_as_py(key, t.key_type, map_pairs=map_pairs)
            if not map_pairs and isinstance(key, (dict, list)):
                key = text  # unhashable: a dict keeps its JSON text
            typed.append((key, json_value_as_py(item, t.item_type, map_pairs=map_pairs)))
        return typed if map_pairs else dict(typed)
    if pa.types.is_struct(t) and isinstance(value, dict):
        return {
            k: json_value_as_py(v, t.field(k).type, map_pairs=map_pairs) if k in t.names else v
            for k, v in value.items()
        }
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if is_list and isinstance(value, list):
        return [json_value_as_py(v, t.value_type, map_pairs=map_pairs) for v in value]
    return value


def _map_rows(array: pa.Array, column: str) -> list[Any]:
    """Python values with maps as dicts; a map with a key twice is refused (a JSON object,
    and every reader's dict, would keep only the last value)."""
    try:
        return array.to_pylist(maps_as_pydicts="strict")
    except KeyError:
        for row in range(len(array)):
            try:
                array[row].as_py(maps_as_pydicts="strict")
            except KeyError as exc:
                found = re.search(r"duplicate key was (.*)\)", str(exc.args[0]))
                key = found.group(1) if found else "a key"
                raise EncodingError(
                    column,
                    f"a map holds the key {key} twice; a map is stored as a JSON "
                    "object (one value per key): make its keys unique",
                    row,
                ) from None
        raise


class JsonEncoding(Encoding):
    """Python's JSON, as Mosaic's ``json`` encoding writes it: non-finite floats are the
    tokens ``NaN``, ``Infinity``, ``-Infinity`` (which ``json.loads`` reads back), and a
    float's shortest repr round-trips exactly (``-0.0`` included)."""

    holds_nulls = True

    name = "json"

    def encode(self, array: pa.Array, column: str) -> Pieces:
        texts = []
        for row, value in enumerate(_map_rows(array, column)):
            try:
                texts.append(json.dumps(_jsonable(value)).encode())
            except (TypeError, ValueError) as exc:
                raise EncodingError(column, f"value is not JSON-serializable: {exc}", row) from None
        return _pieces_from_bytes(texts)

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        if n == 0:
            return np.empty(0, dtype=object)
        _binary_array(pieces, True, column)  # UTF-8 check
        try:
            values = json.loads(_json_list_text(pieces, n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            values = None
        if not isinstance(values, list) or len(values) != n:
            # One value was not a complete JSON text: find it (rare, error path only).
            texts = _binary_array(pieces, True, column).to_pylist()
            for row, text in enumerate(texts):
                try:
                    json.loads(text)
                except json.JSONDecodeError as exc:
                    raise EncodingError(
                        column, f"stored value {row} is not valid JSON: {exc}"
                    ) from None
            raise EncodingError(column, "stored values are not one JSON value each")
        return _object_array(values)

    def arrow_type(self) -> pa.DataType:
        return pa.string()


def _json_list_text(pieces: Pieces, n: int) -> bytes:
    """``[v0,v1,...]`` from n JSON texts, by one scatter: one ``json.loads`` per batch."""
    assert pieces.offsets is not None
    offsets = pieces.offsets - pieces.offsets[0]
    total = int(offsets[-1])
    out = np.full(total + n + 1, ord(","), dtype=U8)
    out[0], out[-1] = ord("["), ord("]")
    lengths = np.diff(offsets)
    shift = np.repeat(np.arange(1, n + 1, dtype=I64), lengths)
    first = int(pieces.offsets[0])
    out[np.arange(total, dtype=I64) + shift] = pieces.data[first : first + total]
    return out.tobytes()


class PickleEncoding(Encoding):
    name = "pkl"
    safe = False
    holds_nulls = True

    def encode(self, array: pa.Array, column: str) -> Pieces:
        return _pieces_from_bytes([pickle.dumps(v) for v in array.to_pylist()])

    def decode(self, pieces: Pieces, n: int, column: str, options: DecodeOptions) -> np.ndarray:
        self.check_safe(column, options)
        raw = _binary_array(pieces, False, column).to_pylist()
        return _object_array([pickle.loads(b) for b in raw])

    def arrow_type(self) -> pa.DataType:
        return pa.binary()


# --------------------------------------------------------------------------- registry

_SCALARS = {
    "int": "int64",
    **{name: name for name in _DTYPE_CODES},
}
# Encodings whose values are numbers: the scalars and the numbers stored as text
# (each encoding also says so itself: ``get_encoding(name).numeric``).
NUMERIC_ENCODINGS = frozenset(_SCALARS) | {"str_int", "str_float"}


def _registry() -> dict[str, Callable[[], Encoding]]:
    """Every encoding name an index may use, mapped to its constructor: the one list.

    ``ndarray:DTYPE[:SHAPE]`` names are parameters of ``ndarray`` and parsed on lookup.
    """
    table: dict[str, Callable[[], Encoding]] = {}
    for name, dtype in _SCALARS.items():
        table[name] = partial(ScalarEncoding, name, dtype)
    table.update(bytes=BytesEncoding, str=StrEncoding, json=JsonEncoding, pkl=PickleEncoding)
    for name in ("str_int", "str_float", "str_decimal"):
        table[name] = partial(StrNumberEncoding, name)
    for name in ("jpeg", "png", "pil"):
        table[name] = partial(ImageEncoding, name)
    # "jpegarray" is how some Mosaic versions spell "jpeg_array": both are read.
    for name in ("list[jpeg]", "list[png]", "list[pil]", "jpeg_array", "jpegarray"):
        table[name] = partial(ImageListEncoding, name)
    table["ndarray"] = NDArrayEncoding
    return table


_REGISTRY = _registry()


def get_encoding(name: str) -> Encoding:
    """The encoding an index names; ValueError for names MDS does not define."""
    make = _REGISTRY.get(name)
    if make is not None:
        return make()
    if name.startswith("ndarray:"):
        return NDArrayEncoding.parse(name[len("ndarray:") :])
    raise ValueError(f"unknown MDS encoding {name!r}; known: {encoding_names()}")


def encoding_names() -> list[str]:
    """The names :func:`get_encoding` accepts (``ndarray`` also takes ``:DTYPE[:SHAPE]``)."""
    return sorted(_REGISTRY)


def uniform_shape(array: pa.Array, column: str) -> list[int] | None:
    """The one shape of every nested-list value in ``array`` (None: they differ).

    ``array`` is null-free (the writer fills nulls before encoding).
    """
    if len(array) == 0:
        return None
    shapes = _nested_values(array, column)[1]
    if np.all(shapes == shapes[0]):
        return [int(d) for d in shapes[0]]
    return None


def merge_shapes(
    held: dict[str, list[int] | None] | None, new: dict[str, list[int] | None]
) -> dict[str, list[int] | None]:
    """Shapes of a shard gaining rows with shapes ``new``: equal stays, else None."""
    if held is None:
        return dict(new)
    return {k: v if v == new.get(k) else None for k, v in held.items()}


def _leaf_type(t: pa.DataType) -> tuple[pa.DataType, list[int | None]]:
    dims: list[int | None] = []
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        dims.append(t.list_size if pa.types.is_fixed_size_list(t) else None)
        t = t.value_type
    return t, dims


def infer_encoding(field: pa.Field) -> str:
    """The encoding a column gets when the spec names none, from its Arrow type."""
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return "uint8"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()).name
    if pa.types.is_decimal(t):
        return "str_decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if pa.types.is_temporal(t):
        return "int32" if t.bit_width == 32 else "int64"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        leaf, dims = _leaf_type(t)
        numeric = pa.types.is_integer(leaf) or pa.types.is_floating(leaf)
        if numeric or pa.types.is_boolean(leaf):
            dtype = "uint8" if pa.types.is_boolean(leaf) else np.dtype(leaf.to_pandas_dtype()).name
            if all(d is not None for d in dims):
                return f"ndarray:{dtype}:" + ",".join(str(d) for d in dims)
            return f"ndarray:{dtype}"
        return "json"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "json"
    raise EncodingError(field.name, f"Arrow type {t} has no MDS encoding; name one in the spec")
