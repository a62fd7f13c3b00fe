"""Mixtures on the Spark side: DataFrame and pinned Delta sources through the converter
cache, and a saved mixture read back as a Spark table / SQL view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import spark_dl
from spark_dl import Source
from spark_dl.sql import run_sql_file
from spark_dl_core import MixtureError, open_mixture

EXAMPLE = Path(__file__).resolve().parents[2] / "sql_examples" / "03_mixture_view.sql"


@pytest.mark.spark
def test_dataframe_and_delta_sources_record_their_lineage(
    classic_spark: Any, tmp_path: Path
) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = str(tmp_path / "code")
    deltalake.write_deltalake(table, pa.table({"id": np.arange(1000, 1060, dtype=np.int64)}))
    deltalake.write_deltalake(
        table, pa.table({"id": np.arange(2000, 2010, dtype=np.int64)}), mode="append"
    )
    web = classic_spark.range(200)
    code = spark_dl.read_delta(classic_spark, table, version=0)
    m = spark_dl.mix(
        [Source(web, proportion=0.75, name="web"), Source(code, proportion=0.25)],
        epoch_size=160,
        source_column="source",
        cache_dir=str(tmp_path / "cache"),
    )
    assert m.counts == [120, 40]
    assert m.lineage[1]["name"].endswith("code@0")
    assert m.lineage[1]["lineage"]["version"] == 0 and m.lineage[1]["lineage"]["kind"] == "delta"
    ids = np.concatenate([b["id"] for b in m.iter_batches(batch_size=32, shuffle=True, seed=1)])
    code_ids = ids[ids >= 1000]
    assert len(code_ids) == 40 and set(code_ids.tolist()) <= set(range(1000, 1060))
    again = spark_dl.mix(
        [Source(web, proportion=0.75, name="web"), Source(code, proportion=0.25)],
        epoch_size=160,
        source_column="source",
        cache_dir=str(tmp_path / "cache"),
    )
    assert again.fingerprint == m.fingerprint  # the converter cache gives the same datasets


@pytest.mark.spark
def test_saved_mixture_reads_as_a_table_with_exact_counts(spark: Any, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    spark.range(90).write.format("mds").save(a)
    spark.range(1000, 1030).write.format("mds").save(b)
    m = spark_dl.mix(
        [Source(a, repeat=1.0), Source(b, repeat=2.5)], source_column="src", batching="stratified"
    )
    saved = str(tmp_path / "mix.json")
    m.save(saved)
    df = spark.read.format("mds").option("mixture", saved).option("shuffle", "true").load()
    df.createOrReplaceTempView("saved_mixture")
    counts = spark.sql("SELECT src, count(*) AS n FROM saved_mixture GROUP BY src").collect()
    assert {r.src: r.n for r in counts} == {0: 90, 1: 75}
    # the rows are the samples the loader reads in that epoch
    loader_ids = np.concatenate(
        [x["id"] for x in open_mixture(saved).iter_batches(batch_size=1024, shuffle=True)]
    )
    table_ids = np.array([r.id for r in df.select("id").collect()])
    assert sorted(loader_ids.tolist()) == sorted(table_ids.tolist())


@pytest.mark.spark
def test_mixture_view_example_and_bad_specs(spark: Any, tmp_path: Path) -> None:
    rows = run_sql_file(spark, EXAMPLE, variables={"out": str(tmp_path)})[-1].collect()
    assert [(r.source, r.n, r.distinct_ids) for r in rows] == [(0, 300, 300), (1, 100, 50)]
    bad = json.dumps({"sources": [{"path": str(tmp_path / "web"), "proportion": -1}]})
    with pytest.raises(Exception, match="proportion=-1"):
        spark.read.format("mds").option("mixture", bad).load().count()
    with pytest.raises(MixtureError, match="batching"):
        open_mixture({"sources": [{"path": str(tmp_path / "web")}], "batching": "fifo"})


@pytest.mark.spark
def test_a_scheduled_mixture_view_reads_the_cores_order(spark: Any, tmp_path: Path) -> None:
    web, code, math = (str(tmp_path / n) for n in ("web", "code", "math"))
    spark.range(500).write.format("mds").save(web)
    spark.range(1000, 1200).write.format("mds").save(code)
    spark.range(2000, 2040).write.format("mds").save(math)
    spec = {
        "sources": [
            {"path": web, "name": "web"},
            {"path": code, "name": "code"},
            {"path": math, "name": "math"},
        ],
        "epoch_size": 300,
        "source_column": "source",
        # the second stage starts inside epoch 1, at its position 150 (a count string)
        "schedule": [
            {"start": 0, "weights": {"web": 2, "code": 1}},
            {"start": "0.45k", "weights": {"web": 1, "code": 1, "math": 1}},
        ],
    }
    core = open_mixture(spec)
    saved = str(tmp_path / "staged.json")
    core.save(saved)
    inline = json.dumps(spec).replace("'", "\\'")
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW staged USING mds OPTIONS (mixture '{inline}', "
        "shuffle 'true', seed '7', epoch '1')"
    )
    for view in (
        spark.table("staged"),
        spark.read.format("mds")
        .option("mixture", saved)
        .option("shuffle", "true")
        .option("seed", "7")
        .option("epoch", "1")
        .load(),
    ):
        rows = view.select("id", "source").collect()
        want = np.concatenate(
            [b["id"] for b in core.iter_batches(batch_size=64, shuffle=True, seed=7, epoch=1)]
        )
        assert [r.id for r in rows] == want.tolist()  # the same order, row for row
        sources = np.array([r.source for r in rows])
        assert np.bincount(sources[:150], minlength=3).tolist() == [100, 50, 0]
        assert np.bincount(sources[150:], minlength=3).tolist() == [50, 50, 50]
    bad = dict(spec, schedule=[{"start": 0, "weights": {"web": 1, "video": 1}}])
    with pytest.raises(Exception, match=r"schedule stage 0.*'video'"):
        spark.read.format("mds").option("mixture", json.dumps(bad)).load().count()
