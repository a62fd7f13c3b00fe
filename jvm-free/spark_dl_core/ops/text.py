"""Tokenizing text at write time with Hugging Face ``tokenizers`` (the ``text`` extra).

The ``tokenize`` op (:class:`~spark_dl_core.ops.transforms.Tokenize`) names a ``tokenizer.json``
by path or fsspec URL. When a write is planned the file is read once: its sha256 goes into
the spec (so into the dataset's fingerprint) with the facts readers need (vocabulary size,
eos/bos ids); each writing process then loads the tokenizer once and checks the digest, so
executors never tokenize with another file than the one the driver planned with.
"""

from __future__ import annotations

import hashlib
import threading
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import MissingDependencyError, TokenizeError, optional_import

# Token ids fit uint16 up to this vocabulary size, else they are stored as int32.
UINT16_VOCAB = 1 << 16

_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], Any] = {}  # (path, digest) -> Tokenizer, once per process


def _tokenizer_class() -> Any:
    return optional_import("tokenizers", "the tokenize op").Tokenizer


def read_tokenizer_file(path: str, column: str) -> bytes:
    """The bytes of ``path`` (local or an fsspec URL); a missing file names op and column."""
    try:
        if "://" in path:
            import fsspec

            with fsspec.open(path, "rb") as f:
                data: bytes = f.read()
                return data
        with open(path, "rb") as f:
            return f.read()
    except (OSError, ImportError) as exc:
        raise TokenizeError(
            f"tokenize on column {column!r}: cannot read tokenizer {path!r}: {exc}",
            column=column,
            value=path,
        ) from None


def tokenizer_facts(path: str, column: str, eos: str | None, bos: str | None) -> dict[str, Any]:
    """What the spec records of a tokenizer file: its digest, vocabulary size and the ids
    of ``eos`` / ``bos`` (each refused, naming it, when not in the vocabulary)."""
    data = read_tokenizer_file(path, column)
    digest = hashlib.sha256(data).hexdigest()
    tokenizer = _parse(data, path, column)
    added = tokenizer.get_added_tokens_decoder()
    facts: dict[str, Any] = {
        "digest": digest,
        "vocab_size": int(tokenizer.get_vocab_size(with_added_tokens=True)),
        "special_ids": sorted(int(i) for i, t in added.items() if t.special),
    }
    for name, token in (("eos", eos), ("bos", bos)):
        if token is None:
            facts[f"{name}_id"] = None
            continue
        found = tokenizer.token_to_id(token)
        if found is None:
            raise TokenizeError(
                f"tokenize on column {column!r}: {name}_token {token!r} is not in the "
                f"vocabulary of {path!r}",
                column=column,
                value=token,
            )
        facts[f"{name}_id"] = int(found)
    with _LOCK:
        _LOADED.setdefault((path, digest), tokenizer)
    return facts


def _parse(data: bytes, path: str, column: str) -> Any:
    try:
        return _tokenizer_class().from_str(data.decode("utf-8"))
    except (UnicodeDecodeError, Exception) as exc:
        if isinstance(exc, MissingDependencyError):
            raise
        raise TokenizeError(
            f"tokenize on column {column!r}: {path!r} is not a tokenizers JSON file: {exc}",
            column=column,
            value=path,
        ) from None


def load_tokenizer(path: str, digest: str | None, column: str) -> Any:
    """The tokenizer at ``path``, loaded once per process; its content must hash to
    ``digest`` (what the write was planned with)."""
    key = (path, digest or "")
    with _LOCK:
        found = _LOADED.get(key)
    if found is not None:
        return found
    data = read_tokenizer_file(path, column)
    got = hashlib.sha256(data).hexdigest()
    if digest is not None and got != digest:
        raise TokenizeError(
            f"tokenize on column {column!r}: tokenizer {path!r} has sha256 {got[:16]}…, the "
            f"write was planned with {digest[:16]}… (the file changed); plan the write again",
            column=column,
            value=path,
        )
    tokenizer = _parse(data, path, column)
    with _LOCK:
        return _LOADED.setdefault((path, got if digest is None else digest), tokenizer)


def token_type(vocab_size: int) -> pa.DataType:
    """Arrow type of a token column: uint16 ids when the vocabulary fits, else int32."""
    return pa.list_(pa.uint16() if vocab_size <= UINT16_VOCAB else pa.int32())


def encode_texts(
    tokenizer: Any,
    texts: list[str],
    *,
    vocab_size: int,
    eos_id: int | None,
    bos_id: int | None,
    max_length: int | None,
) -> pa.Array:
    """``texts`` as a list array of token ids: one batched ``encode_batch`` call, then
    ``bos`` / ``eos`` added and each document cut to ``max_length`` ids (specials included)."""
    dtype = np.uint16 if vocab_size <= UINT16_VOCAB else np.int32
    ids = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    n = len(ids)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=n)
    # straight into the stored dtype: every id is below the vocabulary size
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    extra = (eos_id is not None) + (bos_id is not None)
    keep = lengths if max_length is None else np.minimum(lengths, max(0, max_length - extra))
    if (keep < lengths).any():  # cut documents: keep each one's first ``keep`` ids
        src = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=src[1:])
        within = np.arange(len(flat), dtype=np.int64) - np.repeat(src[:-1], lengths)
        flat = flat[within < np.repeat(keep, lengths)]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(keep + extra, out=offsets[1:])
    if extra:  # the kept ids fill every slot but each document's bos / eos
        values = np.empty(int(offsets[-1]), dtype=dtype)
        token = np.ones(len(values), dtype=bool)
        if bos_id is not None:
            token[offsets[:-1]] = False
        if eos_id is not None:
            token[offsets[1:] - 1] = False
        values[token] = flat
        if bos_id is not None:
            values[offsets[:-1]] = bos_id
        if eos_id is not None:
            values[offsets[1:] - 1] = eos_id
    else:
        values = flat
    leaf = pa.uint16() if dtype is np.uint16 else pa.int32()
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, leaf))
