"""Declarative, serializable transforms over Arrow record batches.

A transform runs at write time (before encoding; the stored data is the result) or at read
time (after decoding, in the loader). Because they are data, transforms are recorded in the
spec, feed the fingerprint and survive a trip through JSON. The ``python`` transform is the
escape hatch (Petastorm's TransformSpec idea): a function named by import path plus the
schema it promises, which is checked on every batch.

This module is also the op registry's declaring half: every op declares what it is
(:class:`OpFacts`: the kind of decoded column a decode op starts and the stored encodings
it reads, the kinds of decoded column other read ops apply to, the dtype and shape a batch
leaves as). :func:`~spark_dl_core.ops.pipelines.compile_read_ops` splits a loader's ops into
per-column pipelines by those facts and finds each pipeline's implementation by op name in
:mod:`spark_dl_core.ops.registry`, where the media rooms (images, audio, video) register
their work when imported. Nothing here imports those rooms.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from ..errors import SpecError, TokenizeError
from .registry import implementation
from .text import encode_texts, load_tokenizer, token_type, tokenizer_facts


@dataclass(frozen=True)
class OpFacts:
    """What an op declares about itself (a class attribute, not a spec field).

    ``starts``: for a decode op, the kind of decoded column it makes (``"image"``,
    ``"audio"``, ``"video"``), ``reads`` the stored encodings it accepts (``needs`` says
    what those are, for the refusal). ``applies_to``: for the ops after a decode, the kinds
    of decoded column they transform. ``dtype`` / ``shape``: what a batch of the column
    leaves as after the op (None: as before it).
    """

    starts: str | None = None
    reads: tuple[str, ...] = ()
    needs: str = ""
    applies_to: tuple[str, ...] = ()
    dtype: str | None = None
    shape: str | None = None


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at: Literal["write", "read"] = "write"
    facts: ClassVar[OpFacts] = OpFacts()

    def columns_after(self, names: list[str]) -> list[str]:
        """The column names after this op over ``names``; refuses a missing column."""
        column = getattr(self, "column", None)
        if column is not None:
            _require_names(names, [column], getattr(self, "op", "transform"), "column")
        return names


class Select(_Base):
    op: Literal["select"] = "select"
    columns: list[str]

    def columns_after(self, names: list[str]) -> list[str]:
        _require_names(names, self.columns, self.op, "columns")
        _unique(self.columns, f"{self.op} (field 'columns')")
        return list(self.columns)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.columns_after(batch.schema.names)
        return batch.select(self.columns)


class Drop(_Base):
    op: Literal["drop"] = "drop"
    columns: list[str]

    def columns_after(self, names: list[str]) -> list[str]:
        _require_names(names, self.columns, self.op, "columns")
        return [n for n in names if n not in set(self.columns)]

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, self.columns, self.op)
        keep = [n for n in batch.schema.names if n not in set(self.columns)]
        return batch.select(keep)


class Rename(_Base):
    op: Literal["rename"] = "rename"
    mapping: dict[str, str]

    def columns_after(self, names: list[str]) -> list[str]:
        _require_names(names, list(self.mapping), self.op, "mapping")
        after = [self.mapping.get(n, n) for n in names]
        for name in sorted({n for n in after if after.count(n) > 1}):
            sources = [n for n in names if self.mapping.get(n, n) == name]
            raise SpecError(
                f"rename (field 'mapping') would make {after.count(name)} columns named "
                f"{name!r} (from {sources}); drop or rename the existing column first"
            )
        return after

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.rename_columns(self.columns_after(batch.schema.names))


class Cast(_Base):
    """Cast a column to an Arrow type named as pyarrow names it (``float32``, ``int16``…)."""

    op: Literal["cast"] = "cast"
    column: str
    to: str

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        target = _arrow_type(self.to)
        array = batch.column(self.column)
        if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
            target = _with_leaf(array.type, target)
        try:
            cast = pc.cast(array, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SpecError(f"cast of column {self.column!r} to {self.to}: {exc}") from None
        return _replace(batch, self.column, cast)


class Normalize(_Base):
    """``(x - mean) / std`` as float32, for numeric columns and numeric arrays.

    On a decoded image column (read time) values are first scaled to [0, 1] and ``mean`` /
    ``std`` may list one value per channel, as torchvision's ``Normalize`` after
    ``ToTensor``.
    """

    op: Literal["normalize"] = "normalize"
    facts = OpFacts(applies_to=("image", "video"), dtype="float32")
    column: str
    mean: float | list[float]
    std: float | list[Annotated[float, Field(gt=0)]] = Field(default=1.0)

    @field_validator("std")
    @classmethod
    def _positive(cls, std: float | list[float]) -> float | list[float]:
        if isinstance(std, float) and std <= 0:
            raise ValueError("std must be > 0")
        return std

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        if not isinstance(self.mean, float) or not isinstance(self.std, float):
            raise SpecError(
                f"normalize on column {self.column!r}: per-channel mean/std apply to decoded "
                "images at read time only"
            )
        array = batch.column(self.column)
        leaf = array
        while pa.types.is_list(leaf.type) or pa.types.is_fixed_size_list(leaf.type):
            leaf = leaf.flatten()
        if not (pa.types.is_integer(leaf.type) or pa.types.is_floating(leaf.type)):
            raise SpecError(
                f"normalize on column {self.column!r}: needs numbers or arrays of numbers, "
                f"the column is {array.type}"
            )
        values = leaf.to_numpy(zero_copy_only=False).astype(np.float32)
        scaled = pa.array((values - np.float32(self.mean)) / np.float32(self.std))
        if leaf is array:
            return _replace(batch, self.column, scaled)
        return _replace(batch, self.column, _rewrap(array, scaled))


class PythonTransform(_Base):
    """Call ``module:function`` on each batch (as pandas, or Arrow with ``arrow=True``).

    ``output_schema`` maps each output column to its Arrow type name; the result is cast to
    it and any column missing or extra is an error naming it.
    """

    op: Literal["python"] = "python"
    function: str
    output_schema: dict[str, str]
    arrow: bool = False

    def resolve(self) -> Callable[[Any], Any]:
        module_name, _, attr = self.function.partition(":")
        if not module_name or not attr:
            raise SpecError(f"python transform {self.function!r}: write it as 'module:function'")
        try:
            function: Callable[[Any], Any] = getattr(importlib.import_module(module_name), attr)
            return function
        except (ImportError, AttributeError) as exc:
            raise SpecError(
                f"python transform {self.function!r} cannot be imported: {exc}"
            ) from None

    def columns_after(self, names: list[str]) -> list[str]:
        return list(self.output_schema)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        function = self.resolve()
        result = function(batch if self.arrow else batch.to_pandas())
        if not isinstance(result, (pa.RecordBatch, pa.Table)):
            result = pa.RecordBatch.from_pandas(result, preserve_index=False)
        got, want = set(result.schema.names), set(self.output_schema)
        if got != want:
            raise SpecError(
                f"python transform {self.function!r} returned columns {sorted(got)}, "
                f"its output_schema declares {sorted(want)}"
            )
        schema = pa.schema([(n, _arrow_type(t)) for n, t in self.output_schema.items()])
        try:
            table = result if isinstance(result, pa.Table) else pa.Table.from_batches([result])
            table = table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SpecError(f"python transform {self.function!r}: {exc}") from None
        if table.num_rows == 0:
            return pa.RecordBatch.from_pylist([], schema=schema)
        return table.combine_chunks().to_batches()[0]


# --------------------------------------------------------------------------- image ops
#
# Read-time image ops name one image column each and run in the loader (see
# :mod:`spark_dl_core.media.images`): decoded once per sample, geometric ops fused into one
# crop-and-resize, random ones drawn from (fingerprint, seed, epoch, global sample index).

Size = int | tuple[int, int]


# geometric ops: on images, and on every frame of a video clip
_FRAMES = OpFacts(applies_to=("image", "video"))


class _ImageOp(_Base):
    op: str
    at: Literal["read"] = "read"
    column: str

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:  # built in code: the same error as from a dict
            raise SpecError(_invalid({"op": self._op_name(), **data}, exc)) from None

    @classmethod
    def _op_name(cls) -> str:
        return str(cls.model_fields["op"].default)

    @field_validator("size", check_fields=False)
    @classmethod
    def _sizes_at_least_one(cls, size: Size) -> Size:
        sides = (size,) if isinstance(size, int) else size
        if any(side < 1 for side in sides):
            raise ValueError(f"sizes must be >= 1 pixel, got {size!r}")
        return size

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        raise SpecError(f"{self.op} on column {self.column!r} runs in the loader, at read time")


class ImageDecode(_ImageOp):
    """Encoded image bytes (jpeg, png, pil…) to ``uint8`` pixels ``[H, W, C]``.

    ``exact=True``: decode at full resolution and run the geometric ops one after the
    other as torchvision's (v2, tensor) transforms do, instead of one fused resample from
    a reduced-scale decode (see docs/images.md for what it costs).
    """

    op: Literal["image_decode"] = "image_decode"
    facts = OpFacts(
        starts="image",
        reads=("jpeg", "png", "pil", "bytes"),
        needs="image bytes (jpeg, png, pil, bytes)",
        dtype="uint8",
        shape="[B, H, W, C] (a list of [H, W, C] when sizes differ)",
    )
    mode: Literal["RGB", "L"] = "RGB"
    # left out of the spec's JSON when off, so existing fingerprints keep their meaning
    exact: bool = Field(default=False, exclude_if=lambda value: not value)


class Resize(_ImageOp):
    """``size=int``: the shorter side becomes ``size`` (aspect kept); ``(h, w)``: exact."""

    op: Literal["resize"] = "resize"
    facts = _FRAMES
    size: Size = Field(union_mode="left_to_right")


class CenterCrop(_ImageOp):
    """The central ``size`` (``int``: square) of the image; a side larger than the image
    is padded with ``fill`` (torchvision's ``center_crop``)."""

    op: Literal["center_crop"] = "center_crop"
    facts = _FRAMES
    size: Size = Field(union_mode="left_to_right")
    fill: int = Field(default=0, ge=0, le=255)


class RandomResizedCrop(_ImageOp):
    """A random area fraction in ``scale`` with aspect ratio in ``ratio``, resized to
    ``size`` (torchvision's RandomResizedCrop)."""

    op: Literal["random_resized_crop"] = "random_resized_crop"
    facts = _FRAMES
    size: Size = Field(union_mode="left_to_right")
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    @field_validator("scale", "ratio")
    @classmethod
    def _ordered(cls, pair: tuple[float, float]) -> tuple[float, float]:
        if not 0 < pair[0] <= pair[1]:
            raise ValueError(f"must be (low, high) with 0 < low <= high, got {pair!r}")
        return pair


class HorizontalFlip(_ImageOp):
    """Mirror left-right with probability ``p``."""

    op: Literal["horizontal_flip"] = "horizontal_flip"
    facts = _FRAMES
    p: float = Field(default=0.5, ge=0, le=1)


class ToCHW(_ImageOp):
    """Batch layout ``[B, C, H, W]`` instead of ``[B, H, W, C]``."""

    op: Literal["to_chw"] = "to_chw"
    facts = OpFacts(applies_to=("image", "video"), shape="[B, C, H, W]; video [B, T, C, H, W]")


class ReencodeImage(_Base):
    """Write time: re-encode images larger than ``max_side`` (either side) as JPEG of
    ``quality``, shrunk to fit, so stored datasets are training-sized. Smaller images are
    kept as they are (their bytes untouched)."""

    op: Literal["reencode_image"] = "reencode_image"
    column: str
    max_side: int = Field(ge=8)
    quality: int = Field(default=90, ge=1, le=100)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        array = batch.column(self.column)
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise SpecError(
                f"reencode_image on column {self.column!r}: needs image bytes, not {array.type}"
            )
        return _replace(batch, self.column, implementation(self.op)(self, array))


class ReencodeAudio(_Base):
    """Write time: re-encode an audio column (WAV, FLAC, OGG...) as ``format`` at
    ``sample_rate`` (None: each clip keeps its rate), mixed down to one channel with
    ``mono``, so stored datasets hold training-ready audio. Clips already in that form keep
    their bytes. Runs where rows are written (Spark's executors for a Spark write)."""

    op: Literal["reencode_audio"] = "reencode_audio"
    column: str
    sample_rate: int | None = Field(default=None, ge=1)
    format: Literal["flac", "wav", "ogg"] = "flac"
    mono: bool = False

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        array = batch.column(self.column)
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise SpecError(
                f"reencode_audio on column {self.column!r}: needs audio bytes, not {array.type}"
            )
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        return _replace(batch, self.column, implementation(self.op)(self, array))


class ReencodeVideo(_Base):
    """Write time: re-encode a video column (MP4, WebM, MKV...) as H.264 in MP4, frames
    scaled to ``size`` (``int``: the shorter side, aspect kept; ``(h, w)``: exact; None:
    as they are; sides even), re-timed to ``fps`` (None: the clip's rate), cut to
    ``max_frames``, keyframes at most ``gop`` frames apart (x264 adds one at a scene cut)
    and no B-frames, so a read-time ``video_decode`` decodes few frames before a clip's
    start. Same input, same bytes.
    Runs where rows are written (Spark's executors for a Spark write)."""

    op: Literal["reencode_video"] = "reencode_video"
    column: str
    size: Size | None = Field(default=None, union_mode="left_to_right")
    fps: float | None = Field(default=None, gt=0)
    gop: int = Field(default=8, ge=1)
    crf: int = Field(default=23, ge=0, le=51)
    max_frames: int | None = Field(default=None, ge=1)

    @field_validator("size")
    @classmethod
    def _even_sides(cls, size: Size | None) -> Size | None:
        sides = () if size is None else (size,) if isinstance(size, int) else size
        if any(side < 2 or side % 2 for side in sides):
            raise ValueError(f"sizes must be even and >= 2 pixels (yuv420p), got {size!r}")
        return size

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        _require(batch, [self.column], self.op)
        array = batch.column(self.column)
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise SpecError(
                f"reencode_video on column {self.column!r}: needs video bytes, not {array.type}"
            )
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        return _replace(batch, self.column, implementation(self.op)(self, array))


class Tokenize(_Base):
    """Write time: a text column to token ids with a Hugging Face ``tokenizers`` file.

    ``output`` receives the ids (``list<uint16>`` when the vocabulary has at most 65,536
    tokens, else ``list<int32>``; stored as ``ndarray:uint16`` / ``ndarray:int32``); the
    text column is kept (add a ``drop`` op after this one to leave it out). ``bos_token`` /
    ``eos_token`` are added around each document, ``max_length`` cuts documents (specials
    included). ``digest``, ``vocab_size``, ``eos_id``, ``bos_id`` and ``special_ids`` are
    filled in when the write is planned (:func:`resolve_write_ops`): the file's sha256 is
    part of the spec.
    """

    op: Literal["tokenize"] = "tokenize"
    column: str
    tokenizer: str
    output: str = "tokens"
    eos_token: str | None = None
    bos_token: str | None = None
    max_length: int | None = Field(default=None, ge=1)
    digest: str | None = None
    vocab_size: int | None = None
    eos_id: int | None = None
    bos_id: int | None = None
    special_ids: list[int] | None = None

    def resolved(self) -> Tokenize:
        """This op with the tokenizer file's digest and facts recorded (reads the file)."""
        facts = tokenizer_facts(self.tokenizer, self.column, self.eos_token, self.bos_token)
        if self.digest is not None and self.digest != facts["digest"]:
            raise TokenizeError(
                f"tokenize on column {self.column!r}: tokenizer {self.tokenizer!r} has sha256 "
                f"{facts['digest'][:16]}…, the spec records {self.digest[:16]}…",
                column=self.column,
                value=self.tokenizer,
            )
        return self.model_copy(update=facts)

    def columns_after(self, names: list[str]) -> list[str]:
        """``names`` with ``output`` added; refuses a missing text column or an output that
        would overwrite another column (as ``rename`` does)."""
        if self.column not in names:
            raise TokenizeError(
                f"tokenize names missing column {self.column!r} (columns: {names})",
                column=self.column,
            )
        if self.output != self.column and self.output in names:
            raise TokenizeError(
                f"tokenize on column {self.column!r} (field 'output') names {self.output!r}, "
                "which is another existing column: its values would be replaced by token ids; "
                "pick another output name, or drop or rename the existing column first",
                column=self.column,
                value=self.output,
            )
        return names if self.output in names else [*names, self.output]

    def check_input(self, schema: pa.Schema) -> None:
        """Refuse, naming op, column and type, a column that is missing or not text, or an
        output that names another existing column."""
        self.columns_after(schema.names)
        t = schema.field(self.column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise TokenizeError(
                f"tokenize on column {self.column!r}: needs a string column, it is {t}",
                column=self.column,
                value=str(t),
            )

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.check_input(batch.schema)
        op = self if self.vocab_size is not None else self.resolved()
        assert op.vocab_size is not None
        array = batch.column(self.column)
        if batch.num_rows == 0:
            out = pa.array([], type=token_type(op.vocab_size))
        else:
            if array.null_count:
                first = int(np.flatnonzero(pc.is_null(array).to_numpy(zero_copy_only=False))[0])
                raise TokenizeError(
                    f"tokenize on column {self.column!r}: null text at row {first}; fill or "
                    "filter nulls before tokenizing",
                    column=self.column,
                    value=None,
                )
            tokenizer = load_tokenizer(op.tokenizer, op.digest, self.column)
            out = encode_texts(
                tokenizer,
                array.to_pylist(),
                vocab_size=op.vocab_size,
                eos_id=op.eos_id,
                bos_id=op.bos_id,
                max_length=self.max_length,
            )
        if self.output in batch.schema.names:
            return _replace(batch, self.output, out)
        return pa.RecordBatch.from_arrays(
            [*batch.columns, out], names=[*batch.schema.names, self.output]
        )


def resolve_write_ops(transforms: list[Any], schema: pa.Schema | None) -> list[Any]:
    """The write transforms with each ``tokenize`` op's tokenizer facts recorded, checked
    against the input ``schema`` (when known) as the earlier ops leave it: run when a write
    is planned, so a missing file, an unknown special token or a non-text column is refused
    before any task starts."""
    out: list[Any] = []
    current = pa.RecordBatch.from_pylist([], schema=schema) if schema is not None else None
    for t in transforms:
        if isinstance(t, Tokenize) and t.at == "write":
            if current is not None:
                t.check_input(current.schema)
            t = t.resolved()
        out.append(t)
        if current is not None and t.at == "write":
            current = t.apply(current)
    return out


# Audio and video: read-time ops run by :mod:`spark_dl_core.media.clips`, seeded like the image
# ops (random windows drawn from fingerprint, seed, epoch and the global sample index).


class AudioDecode(_ImageOp):
    """Encoded audio (WAV, FLAC, OGG/Vorbis, MP3) to float32 in [-1, 1], channels first,
    resampled to ``sample_rate`` (None: every clip keeps its own rate), ``mono`` averaging
    the channels."""

    op: Literal["audio_decode"] = "audio_decode"
    facts = OpFacts(
        starts="audio",
        reads=("bytes",),
        needs="encoded bytes (write the files' bytes as a binary column)",
        dtype="float32",
        shape="[B, C, T] (mono clips of different lengths: ragged [B, T*])",
    )
    sample_rate: int | None = Field(default=None, ge=1)
    mono: bool = False


class AudioCrop(_ImageOp):
    """A window of ``seconds`` (decoded alone where the format seeks), from a random, the
    first or the central position; shorter clips zero-padded to it when ``pad``."""

    op: Literal["audio_crop"] = "audio_crop"
    facts = OpFacts(applies_to=("audio",))
    seconds: float = Field(gt=0)
    start: Literal["random", "begin", "center"] = "random"
    pad: bool = True


class VideoDecode(_ImageOp):
    """``num_frames`` frames ``stride`` apart, from a random, the first or the central
    position of the clip, as uint8 RGB ``[T, H, W, C]``; ``resize`` / ``center_crop`` after
    it apply to every frame. A clip with fewer frames repeats its last one."""

    op: Literal["video_decode"] = "video_decode"
    facts = OpFacts(
        starts="video",
        reads=("bytes",),
        needs="encoded bytes (write the files' bytes as a binary column)",
        dtype="uint8",
        shape="[B, T, H, W, C]",
    )
    num_frames: int = Field(default=8, ge=1)
    stride: int = Field(default=1, ge=1)
    start: Literal["random", "begin", "center"] = "random"


Transform = Annotated[
    Select
    | Drop
    | Rename
    | Cast
    | Normalize
    | PythonTransform
    | ImageDecode
    | Resize
    | CenterCrop
    | RandomResizedCrop
    | HorizontalFlip
    | ToCHW
    | ReencodeImage
    | Tokenize
    | AudioDecode
    | AudioCrop
    | VideoDecode
    | ReencodeAudio
    | ReencodeVideo,
    Field(discriminator="op"),
    BeforeValidator(lambda value: _check_op(value)),
]
_TRANSFORM = TypeAdapter(Transform)


def op_models() -> list[type[_Base]]:
    """Every transform op's model, in the order the ops are declared."""
    return list(get_args(get_args(Transform)[0]))


def known_ops() -> list[str]:
    """Every transform op name, in the order the ops are declared."""
    return [m.model_fields["op"].default for m in op_models()]


def ops_for(kind: str) -> list[str]:
    """The ops that apply to a decoded column of ``kind`` (``"image"``, ``"video"``...)."""
    return [m.model_fields["op"].default for m in op_models() if kind in m.facts.applies_to]


def decoders_of(kinds: tuple[str, ...]) -> list[str]:
    """The decode ops that make a column of one of ``kinds``."""
    return [m.model_fields["op"].default for m in op_models() if m.facts.starts in kinds]


# --------------------------------------------------------------------------- read time
#
# Random read-time ops (crop windows, clip starts, flips) draw from one generator per
# sample keyed by (dataset fingerprint, seed, epoch) and the sample's global index: the
# same draws on any world size, worker count and after resume, whatever room runs the op.


def augment_key(fingerprint: str, seed: int, epoch: int) -> bytes:
    return hashlib.sha256(f"spark-dl-augment:{fingerprint}:{seed}:{epoch}".encode()).digest()


def sample_rngs(key: bytes, indices: np.ndarray) -> list[np.random.Generator]:
    """One generator per global sample index, keyed by (fingerprint, seed, epoch)."""
    words = np.frombuffer(key[:16], dtype=np.uint64)
    return [
        np.random.Generator(np.random.Philox(key=np.array([words[0] ^ int(i), words[1]])))
        for i in np.asarray(indices, dtype=np.uint64).tolist()
    ]


def _check_op(value: Any) -> Any:
    """An unknown or missing op refused naming the known ops and the closest one (rather
    than pydantic's dump of the whole tagged union)."""
    if not isinstance(value, Mapping):
        return value
    ops = known_ops()
    listed = ", ".join(ops)
    if "op" not in value:
        raise SpecError(f"a transform names its op ({{'op': ...}}); the ops are: {listed}")
    op = value["op"]
    if op not in ops:
        close = difflib.get_close_matches(str(op), ops, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SpecError(f"unknown transform op {op!r}{hint}; the ops are: {listed}")
    return value


def parse_transforms(transforms: Any) -> list[Any]:
    """Transform models from models or plain dicts (``{"op": "resize", ...}``)."""
    if transforms is None:
        return []
    if isinstance(transforms, (BaseModel, dict)):
        transforms = [transforms]
    out = []
    for t in transforms:
        if isinstance(t, BaseModel):
            out.append(t)
            continue
        try:
            out.append(_TRANSFORM.validate_python(t))
        except ValidationError as exc:
            raise SpecError(_invalid(t, exc)) from None
    return out


def _invalid(given: Any, exc: ValidationError) -> str:
    """A transform's validation problems, naming the op, its column and each field
    (``resize.size: ...``), without pydantic's tagged-union dump."""
    op = given.get("op") if isinstance(given, dict) else None
    problems = []
    for error in exc.errors():
        inner = (error.get("ctx") or {}).get("error")
        if isinstance(inner, SpecError):  # raised by an op's own __init__: already worded
            return str(inner)
        loc = [str(part) for part in error.get("loc", ())]
        if op and loc and loc[0] != op:
            loc.insert(0, str(op))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(".".join(loc) + (": " if loc else "") + message)
    if op is None:
        return f"transform {given!r} is not valid: " + "; ".join(problems)
    column = f" on column {given['column']!r}" if "column" in given else ""
    return f"transform {op}{column} is not valid: " + "; ".join(problems)


def apply_transforms(
    batch: pa.RecordBatch, transforms: list[Any], at: Literal["write", "read"]
) -> pa.RecordBatch:
    """Run, in order, the transforms that belong to stage ``at``."""
    for transform in transforms:
        if transform.at == at:
            batch = transform.apply(batch)
    return batch


def check_transforms(transforms: list[Any], names: list[str], at: str = "read") -> list[str]:
    """The column names after the ops of stage ``at`` run over ``names``, checked before
    any data is read: an op naming a missing column, or making two columns of one name, is
    a :class:`SpecError` naming the op, its field and the column."""
    for transform in transforms:
        if transform.at == at:
            names = transform.columns_after(names)
    return names


def _require(batch: pa.RecordBatch, columns: list[str], op: str) -> None:
    missing = [c for c in columns if c not in batch.schema.names]
    if missing:
        raise SpecError(f"{op} transform names missing column(s) {missing}")


def _require_names(names: list[str], wanted: list[str], op: str, field: str) -> None:
    missing = [c for c in wanted if c not in names]
    if missing:
        what = f"column {missing[0]!r}" if len(missing) == 1 else f"columns {missing}"
        raise SpecError(
            f"{op} names {what} (field {field!r}), which the columns at this step do not "
            f"include (they are {names})"
        )


def _unique(names: list[str], where: str) -> None:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecError(f"{where} names column {twice[0]!r} {names.count(twice[0])} times")


def _arrow_type(name: str) -> pa.DataType:
    try:
        return pa.type_for_alias(name)
    except (ValueError, KeyError):
        raise SpecError(
            f"{name!r} is not an Arrow type name (try float32, int64, string)"
        ) from None


def _with_leaf(list_type: pa.DataType, leaf: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(list_type):
        return pa.list_(_with_leaf(list_type.value_type, leaf), list_type.list_size)
    if pa.types.is_list(list_type):
        return pa.list_(_with_leaf(list_type.value_type, leaf))
    return leaf


def _rewrap(array: pa.Array, leaves: pa.Array) -> pa.Array:
    """Put new leaf values back into the list structure of ``array``."""
    if pa.types.is_fixed_size_list(array.type):
        inner = _rewrap(array.flatten(), leaves)
        return pa.FixedSizeListArray.from_arrays(inner, array.type.list_size)
    if pa.types.is_list(array.type):
        offsets = pc.subtract(array.offsets, array.offsets[0])
        return pa.ListArray.from_arrays(offsets, _rewrap(array.flatten(), leaves))
    return leaves


def _replace(batch: pa.RecordBatch, column: str, array: pa.Array) -> pa.RecordBatch:
    index = batch.schema.get_field_index(column)
    arrays = list(batch.columns)
    arrays[index] = array
    names = batch.schema.names
    return pa.RecordBatch.from_arrays(arrays, names=names)
