"""The ``tokenize`` write op: ids as the tokenizer gives them, the file's digest in the spec,
refusals when the write is planned, and the same op inside Spark executors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import TokenizeError
from spark_dl_core.format.index import META_FILE

TEXTS = [
    f"row {i}: the quick brown fox jumps over {i % 13} lazy dogs" * (1 + i % 4) for i in range(300)
]


def train(path: Path, vocab_size: int = 300) -> str:
    """A small byte-level BPE tokenizer trained offline on TEXTS, saved at ``path``."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"]
    )
    tok.train_from_iterator(TEXTS, trainer)
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return train(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _op(path: str, **extra: Any) -> dict[str, Any]:
    return {"op": "tokenize", "column": "text", "tokenizer": path, "eos_token": "</s>", **extra}


def test_tokenize_writes_the_tokenizers_ids_with_eos(tokenizer_file: str, tmp_path: Path) -> None:
    spec = DatasetSpec(transforms=[_op(tokenizer_file)])
    result = write_mds(pa.table({"text": TEXTS}), str(tmp_path / "ds"), spec)
    ds = open_dataset(str(tmp_path / "ds"))
    assert ds.columns["tokens"] == "ndarray:uint16"
    tok = Tokenizer.from_file(tokenizer_file)
    eos = tok.token_to_id("</s>")
    got = next(ds.iter_batches(batch_size=len(TEXTS)))
    for text, ids, stored in zip(TEXTS, got["text"], got["tokens"]):
        assert ids == text
        want = [*tok.encode(text, add_special_tokens=False).ids, eos]
        assert stored.dtype == np.uint16 and stored.tolist() == want
    recorded = result.meta["spec"]["transforms"][0]
    digest = hashlib.sha256(Path(tokenizer_file).read_bytes()).hexdigest()
    assert recorded["digest"] == digest
    assert recorded["vocab_size"] == tok.get_vocab_size() and recorded["eos_id"] == eos


def test_bos_and_max_length_cut_documents_specials_included(
    tokenizer_file: str, tmp_path: Path
) -> None:
    op = _op(tokenizer_file, bos_token="<s>", max_length=6, output="ids")
    write_mds(pa.table({"text": TEXTS[:20]}), str(tmp_path / "ds"), DatasetSpec(transforms=[op]))
    got = next(open_dataset(str(tmp_path / "ds")).iter_batches(batch_size=20))
    tok = Tokenizer.from_file(tokenizer_file)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    for text, ids in zip(TEXTS[:20], got["ids"]):
        body = tok.encode(text, add_special_tokens=False).ids[:4]
        assert ids.tolist() == [bos, *body, eos]


@pytest.mark.parametrize("vocab_size", [300, 70_000])
def test_encode_texts_matches_per_document_ids(tokenizer_file: str, vocab_size: int) -> None:
    """The vectorized assembly (ids straight into the stored dtype, specials and cuts by
    masks) equals each document's ids with bos / eos around them, cut to max_length."""
    from spark_dl_core.ops.text import encode_texts

    tok = Tokenizer.from_file(tokenizer_file)
    texts = ["", "a", *TEXTS[:60], ""]
    plain = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    for eos in (None, 2):
        for bos in (None, 1):
            for max_length in (None, 0, 1, 2, 7, 10_000):
                got = encode_texts(
                    tok, texts, vocab_size=vocab_size, eos_id=eos, bos_id=bos, max_length=max_length
                )
                room = (eos is not None) + (bos is not None)
                want = []
                for ids in plain:
                    body = ids if max_length is None else ids[: max(0, max_length - room)]
                    want.append([bos] * (bos is not None) + body + [eos] * (eos is not None))
                leaf = pa.uint16() if vocab_size <= 1 << 16 else pa.int32()
                assert got.type == pa.list_(leaf)
                assert got.to_pylist() == want, (eos, bos, max_length)


def test_the_tokenizer_files_content_is_in_the_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    fingerprints = []
    for vocab in (280, 300):
        train(path, vocab)  # same path, another file
        spec = DatasetSpec(transforms=[_op(str(path))])
        out = write_mds(pa.table({"text": TEXTS}), str(tmp_path / f"ds{vocab}"), spec)
        fingerprints.append(out.fingerprint)
    assert fingerprints[0] != fingerprints[1]


def test_large_vocabularies_store_int32(tmp_path: Path) -> None:
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["</s>"] = 70_000
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = str(tmp_path / "big.json")
    tok.save(path)
    table = pa.table({"text": ["w1 w69999 w65536", "w7"]})
    write_mds(table, str(tmp_path / "ds"), DatasetSpec(transforms=[_op(path)]))
    ds = open_dataset(str(tmp_path / "ds"))
    assert ds.columns["tokens"] == "ndarray:int32"
    got = next(ds.iter_batches(batch_size=2))["tokens"]
    assert got[0].tolist() == [1, 69999, 65536, 70000] and got[1].tolist() == [7, 70000]


@pytest.mark.parametrize(
    ("table", "op", "named"),
    [
        (pa.table({"text": ["a"]}), {"tokenizer": "/nonexistent/tokenizer.json"}, "/nonexistent"),
        (pa.table({"text": ["a"]}), {"eos_token": "<eot>"}, "<eot>"),
        (pa.table({"text": [1, 2]}), {}, "int64"),
        (pa.table({"body": ["a"]}), {}, "text"),
        (pa.table({"id": [7], "text": ["a"]}), {"output": "id"}, "'id'"),
    ],
    ids=["missing-file", "eos-not-in-vocab", "not-text", "missing-column", "output-exists"],
)
def test_bad_tokenize_ops_are_refused_when_the_write_is_planned(
    tokenizer_file: str, tmp_path: Path, table: pa.Table, op: dict[str, Any], named: str
) -> None:
    spec = DatasetSpec(transforms=[{**_op(tokenizer_file), **op}])
    with pytest.raises(TokenizeError) as err:
        write_mds(table, str(tmp_path / "ds"), spec)
    assert "tokenize" in str(err.value) and "'text'" in str(err.value)
    assert named in str(err.value) and err.value.column == "text"
    assert not (tmp_path / "ds").exists() or not os.listdir(tmp_path / "ds")


def test_tokenize_in_place_replaces_the_text_column(tokenizer_file: str, tmp_path: Path) -> None:
    """``output`` equal to ``column`` is the one overwrite allowed: the text becomes its ids."""
    spec = DatasetSpec(transforms=[_op(tokenizer_file, output="text")])
    write_mds(pa.table({"id": [1, 2], "text": TEXTS[:2]}), str(tmp_path / "ds"), spec)
    ds = open_dataset(str(tmp_path / "ds"))
    assert ds.columns == {"id": "int64", "text": "ndarray:uint16"}


def test_a_tokenizer_changed_after_planning_is_refused_in_the_task(tmp_path: Path) -> None:
    from spark_dl_core import ShardWriter
    from spark_dl_core.ops import text
    from spark_dl_core.spec import planned_spec
    from spark_dl_core.store.storage import Store

    path = tmp_path / "tokenizer.json"
    train(path, 280)
    spec = planned_spec(DatasetSpec(transforms=[_op(str(path))]))
    train(path, 300)  # the file changes between planning and the task
    text._LOADED.clear()  # as in a fresh executor process
    (tmp_path / "ds").mkdir()
    writer = ShardWriter(Store(str(tmp_path / "ds")), spec)
    with pytest.raises(TokenizeError, match="planned with"):
        writer.write(pa.table({"text": TEXTS[:5]}).to_batches()[0])


def test_null_text_is_refused_naming_the_row(tokenizer_file: str, tmp_path: Path) -> None:
    spec = DatasetSpec(transforms=[_op(tokenizer_file)])
    with pytest.raises(TokenizeError, match="null text at row 1"):
        write_mds(pa.table({"text": ["a", None]}), str(tmp_path / "ds"), spec)


def test_tokenize_runs_in_spark_executors(
    classic_spark: Any, tokenizer_file: str, tmp_path: Path
) -> None:
    import spark_dl  # noqa: F401  (registers the mds source)

    df = classic_spark.createDataFrame([(t,) for t in TEXTS], "text string").repartition(2)
    spec = {"transforms": [_op(tokenizer_file), {"op": "drop", "columns": ["text"]}]}
    path = str(tmp_path / "spark")
    df.write.format("mds").option("spec", json.dumps(spec)).save(path)
    ds = open_dataset(path)
    assert list(ds.columns) == ["tokens"]
    tok = Tokenizer.from_file(tokenizer_file)
    eos = tok.token_to_id("</s>")
    want = sorted((*tok.encode(t, add_special_tokens=False).ids, eos) for t in TEXTS)
    got = sorted(tuple(a.tolist()) for a in next(ds.iter_batches(batch_size=1000))["tokens"])
    assert got == want
    meta = json.loads((Path(path) / META_FILE).read_text())
    assert meta["spec"]["transforms"][0]["digest"]
    loader = df.dl.to_torch(
        batch_size=2,
        spec=spec,
        cache_dir=str(tmp_path / "cache"),
        pack={"column": "tokens", "seq_len": 16},
    )
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (2, 16) and batch["cu_seqlens"][-1] == 32
    bad = {"transforms": [_op("/nonexistent/tok.json")]}
    with pytest.raises(Exception, match="cannot read tokenizer") as err:
        df.write.format("mds").option("spec", json.dumps(bad)).save(str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").glob("shard*"))
    del err


def test_the_tokenizers_own_special_tokens_are_not_added(tmp_path: Path) -> None:
    """A tokenizer whose post-processor wraps every encoding (``<s> … </s>``, as BERT's
    ``[CLS] … [SEP]``) gets the document's ids only: specials come from ``bos_token`` /
    ``eos_token``, so they are never added twice (docs/llm.md says so)."""
    from tokenizers import processors

    path = train(tmp_path / "plain.json")
    tok = Tokenizer.from_file(path)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    tok.save(str(tmp_path / "wrapping.json"))
    op = {"op": "tokenize", "column": "text", "tokenizer": str(tmp_path / "wrapping.json")}
    write_mds(pa.table({"text": TEXTS[:5]}), str(tmp_path / "ds"), DatasetSpec(transforms=[op]))
    got = next(open_dataset(str(tmp_path / "ds")).iter_batches(batch_size=5))
    for text, ids in zip(TEXTS[:5], got["tokens"]):
        assert tok.encode(text).ids[0] == bos  # the tokenizer alone would wrap it
        assert ids.tolist() == tok.encode(text, add_special_tokens=False).ids
