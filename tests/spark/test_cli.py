"""The real ``spark-dl`` entry point, run as a subprocess: export, inspect, verify, sql."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")
from deltalake import write_deltalake  # noqa: E402

_BIN = Path(sys.executable).with_name("spark-dl")
CLI = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "spark_dl.cli"]


# What PySpark sets in this process while a Spark Connect session of the suite is alive: a
# CLI started with them would take its own session for a Connect one
_CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE")


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _CONNECT_ENV}


def run(*args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
    env = dict(cli_env(), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=240)
    if check is not None:
        assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("cli") / "events")
    data = pa.table(
        {
            "id": list(range(50)),
            "label": [i % 3 for i in range(50)],
            "text": [f"t{i}" for i in range(50)],
        }
    )
    write_deltalake(path, data)
    write_deltalake(path, data.slice(0, 10), mode="append")
    return path


@pytest.fixture(scope="module")
def exported(table: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("out")
    spec = root / "spec.json"
    spec.write_text(json.dumps({"compression": "zstd", "hashes": ["xxh64"], "shard_size": 400}))
    out = str(root / "ds")
    proc = run("export", table, "--version", "0", "--out", out, "--spec", str(spec), "--json")
    return {"out": out, "result": json.loads(proc.stdout), "stderr": proc.stderr}


def test_help_and_usage_errors() -> None:
    assert "export" in run("--help").stdout
    assert "--version" in run("export", "--help").stdout
    assert run(check=2).returncode == 2
    assert run("export", "tbl", check=2).returncode == 2  # --out missing
    assert run("frobnicate", check=2).returncode == 2
    assert run("export", "t", "--out", "o", "--version", "x", check=2).returncode == 2


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["export", "t", "--out", "o", "--timestamp", "yesterday"], "--timestamp"),
        (["vacuum", "somewhere", "--retention", "-5"], "--retention"),
        (["vacuum", "somewhere", "--retention", "soon"], "--retention"),
        (["sql", "q.sql", "--var", "out"], "--var"),
        (["show", "somewhere", "--rows", "-1"], "--rows"),
        (["export", "t", "--out", "o", "--nulls", "drop"], "--nulls"),
    ],
)
def test_bad_flag_values_are_usage_errors(args: list[str], flag: str) -> None:
    assert flag in run(*args, check=2).stderr


def test_inspect_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    from spark_dl_core import write_mds

    out = str(tmp_path / "wide")  # far more output than a pipe buffer holds
    write_mds(pa.table({"text": ["x" * 200] * 3000}), out)
    cmd = " ".join([*CLI, "inspect", out, "--samples", "3000"])
    proc = subprocess.run(
        f"set -o pipefail; {cmd} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        executable="/bin/bash",
        timeout=240,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.count("\n") == 1


def test_export_inspect_verify(exported: dict[str, Any], table: str) -> None:
    result = exported["result"]
    assert result["samples"] == 50 and result["shards"] > 1
    assert result["source"]["version"] == 0
    info = json.loads(run("inspect", exported["out"], "--json").stdout)
    assert info["samples"] == 50 and info["num_shards"] == result["shards"]
    assert info["fingerprint"] == result["fingerprint"]
    assert info["lineage"]["table"] == table and info["lineage"]["version"] == 0
    assert [c["name"] for c in info["columns"]] == ["id", "label", "text"]
    assert info["compression"] == "zstd" and len(info["sample_rows"]) == 3
    assert "fingerprint" in run("inspect", exported["out"]).stdout
    verified = run("verify", exported["out"])
    assert "ok" in verified.stdout


def test_verify_names_corrupted_shard(exported: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(exported["out"], copy)
    shard = sorted(copy.glob("*.mds.zstd"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = run("verify", str(copy), check=1)
    assert shard.name in proc.stderr
    report = json.loads(run("verify", str(copy), "--json", check=1).stdout)
    assert not report["ok"] and [p["file"] for p in report["problems"]] == [str(shard)]


def test_verify_without_hashes_checks_structure(table: str, tmp_path: Path) -> None:
    out = str(tmp_path / "plain")
    run("export", table, "--out", out, "--no-progress")  # latest, no hashes recorded
    n = len(list(Path(out).glob("*.mds")))
    said = run("verify", out).stdout  # says what it compared, shard by shard
    assert f"recorded file hashes 0/{n}" in said, said
    assert f"content hash from spark_dl.json {n}/{n}" in said and f"decoded in full {n}/{n}" in said
    report = json.loads(run("verify", out, "--json").stdout)
    assert all(r["content_hash_checked"] and not r["hashes_checked"] for r in report["shards"])
    shard = sorted(Path(out).glob("*.mds"))[0]
    shard.write_bytes(shard.read_bytes()[:-7])  # truncated
    assert shard.name in run("verify", out, check=1).stderr


def test_export_partitions_that_need_escaping(tmp_path: Path) -> None:
    """Partition values with a space, ``:``, ``/``, ``%``, non-ASCII, and a timestamp."""
    import datetime as dt

    table = str(tmp_path / "parts")
    when = dt.datetime(2024, 1, 2, 10, 0, tzinfo=dt.timezone.utc)
    data = pa.table(
        {
            "id": list(range(5)),
            "part": ["a b", "c:d", "e/f", "g%h", "é"],
            "ts": pa.array([when] * 5, pa.timestamp("us", "UTC")),
        }
    )
    write_deltalake(table, data, partition_by=["part", "ts"])
    out = str(tmp_path / "ds")
    run("export", table, "--out", out, "--no-progress")
    from spark_dl_core import open_dataset

    assert len(open_dataset(out)) == 5


def test_verify_says_when_only_decoding_was_checked(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    """A dataset without spark_dl.json (as Mosaic writes them) has no content hash to compare."""
    import shutil

    copy = tmp_path / "mosaic-like"
    shutil.copytree(exported["out"], copy)
    for own in ("spark_dl.json", "spark_dl.index.arrow"):
        (copy / own).unlink(missing_ok=True)
    n = exported["result"]["shards"]
    said = run("verify", str(copy)).stdout
    assert f"content hash from spark_dl.json 0/{n}" in said and f"file hashes {n}/{n}" in said


def test_vacuum_refuses_what_is_not_a_dataset(table: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a dataset")
    err = run("vacuum", str(empty), "--retention", "0", check=1).stderr
    assert "no dataset at" in err and str(empty) in err
    before = sorted(p.name for p in Path(table).rglob("*"))
    err = run("vacuum", table, "--retention", "0", check=1).stderr
    assert "is a Delta table" in err and "kept" not in err
    assert sorted(p.name for p in Path(table).rglob("*")) == before
    assert (empty / "notes.txt").exists()


def test_export_nulls_flag(tmp_path: Path) -> None:
    assert "--nulls {error,mask}" in run("export", "--help").stdout
    src = str(tmp_path / "sparse")
    write_deltalake(src, pa.table({"id": [1, 2, 3], "score": [0.5, None, 2.0]}))
    err = run("export", src, "--out", str(tmp_path / "a"), "--no-progress", check=1).stderr
    assert "'score'" in err and "--nulls mask" in err and "Traceback" not in err
    out = str(tmp_path / "b")
    run("export", src, "--out", out, "--nulls", "mask", "--no-progress")
    from spark_dl_core import open_dataset

    assert open_dataset(out).to_arrow()["score"].to_pylist() == [0.5, None, 2.0]


def test_export_errors_exit_1(table: str, tmp_path: Path) -> None:
    proc = run("export", table, "--version", "5", "--out", str(tmp_path / "x"), check=1)
    assert "version 5" in proc.stderr and "0..1" in proc.stderr
    assert run("inspect", str(tmp_path / "missing"), check=1).stderr


def test_export_refuses_to_replace_unless_told(table: str, tmp_path: Path) -> None:
    assert "(error, the default" in " ".join(run("export", "--help").stdout.split())
    out = str(tmp_path / "ds")
    first = json.loads(run("export", table, "--version", "0", "--out", out, "--json").stdout)
    proc = run("export", table, "--out", out, "--no-progress", check=1)
    assert "already exists" in proc.stderr and "overwrite" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(run("inspect", out, "--json").stdout)["fingerprint"] == first["fingerprint"]
    again = json.loads(run("export", table, "--out", out, "--mode", "overwrite", "--json").stdout)
    assert again["samples"] == 60 and again["fingerprint"] != first["fingerprint"]


def test_export_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({"a": [1, 2, 3]}), src / "p0.parquet")
    pq.write_table(pa.table({"a": [4, 5]}), src / "p1.parquet")
    res = json.loads(
        run(
            "export", str(src), "--format", "parquet", "--out", str(tmp_path / "o"), "--json"
        ).stdout
    )
    assert res["samples"] == 5 and res["source"]["kind"] == "parquet"


def test_export_parquet_keeps_hive_partition_values(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    src = tmp_path / "hive"
    data = pa.table({"id": list(range(30)), "day": [f"d{i % 3}" for i in range(30)]})
    pq.write_to_dataset(data, str(src), partition_cols=["day"])
    out = str(tmp_path / "o")
    run("export", str(src), "--format", "parquet", "--out", out, "--no-progress")
    from spark_dl_core import open_dataset

    table = open_dataset(out).to_arrow()
    assert sorted(zip(table["id"].to_pylist(), table["day"].to_pylist())) == [
        (i, f"d{i % 3}") for i in range(30)
    ]


@pytest.mark.spark
@pytest.mark.slow
def test_sql_file(tmp_path: Path) -> None:
    sql = tmp_path / "q.sql"
    sql.write_text("SELECT 1 AS one;\nSELECT id * 2 AS twice FROM range(3);\n")
    out = json.loads(run("sql", str(sql), "--json", "--master", "local[1]").stdout)
    assert out[0]["rows"] == [[1]] and out[1]["rows"] == [[0], [2], [4]]
    bad = tmp_path / "bad.sql"
    bad.write_text("SELECT * FROM no_such_table;\n")
    assert "no_such_table" in run("sql", str(bad), check=1).stderr


def test_export_mode_ignore_says_it_skipped(table: str, tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    first = json.loads(run("export", table, "--version", "0", "--out", out, "--json").stdout)
    again = json.loads(run("export", table, "--out", out, "--mode", "ignore", "--json").stdout)
    assert again["skipped"] is True and "skipped" not in first
    assert again["source"]["version"] == 0  # the dataset's version, not the one not written
    assert (again["samples"], again["fingerprint"]) == (first["samples"], first["fingerprint"])
    text = run("export", table, "--out", out, "--mode", "ignore", "--no-progress").stdout
    assert text.startswith("skipped:") and "wrote" not in text


def test_inspect_paths_that_are_not_datasets(exported: dict[str, Any], tmp_path: Path) -> None:
    out = exported["out"]
    err = run("inspect", os.path.join(out, "index.json"), check=1).stderr
    assert "names the index file; open the dataset directory" in err and "index.json/" not in err
    err = run("inspect", os.path.join(out, "spark_dl.json"), check=1).stderr
    assert "is a file, not a dataset directory" in err
    assert "path is empty" in run("inspect", "", check=1).stderr
    assert "Traceback" not in err


@pytest.mark.spark
@pytest.mark.slow
def test_sql_workers_use_the_cli_interpreter(tmp_path: Path) -> None:
    """Without PYSPARK_PYTHON, Spark's workers would start whatever ``python3`` is on PATH;
    the CLI's own session runs them on its interpreter (which has spark_dl installed)."""
    from spark_dl_core import write_mds

    data = str(tmp_path / "ds")
    write_mds(pa.table({"id": list(range(5))}), data)
    sql = tmp_path / "q.sql"
    sql.write_text(
        f"CREATE TEMPORARY VIEW t USING mds OPTIONS (path '{data}');\n"
        "SELECT count(*) AS n FROM t;\n"
    )
    fake = tmp_path / "bin"  # the python3 a worker would find on PATH: not ours
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'not this python' >&2\nexit 3\n")
    (fake / "python3").chmod(0o755)
    unset = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    env = {k: v for k, v in cli_env().items() if k not in unset}
    env["PATH"] = f"{fake}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    proc = subprocess.run(
        [*CLI, "sql", str(sql), "--json", "--master", "local[1]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)[1]["rows"] == [[5]]


def test_inspect_and_show_read_a_delta_table_in_place(tmp_path: Path) -> None:
    """``TABLE@VERSION`` (or a table, at its latest) is read in place: nothing is exported."""
    table = str(tmp_path / "events")
    write_deltalake(
        table, pa.table({"id": list(range(10)), "part": ["a b"] * 10}), partition_by=["part"]
    )
    write_deltalake(
        table, pa.table({"id": [10, 11], "part": ["c", "c"]}), mode="append", partition_by=["part"]
    )
    before = sorted(p.name for p in Path(table).rglob("*"))
    pinned = json.loads(run("inspect", f"{table}@0", "--json").stdout)
    assert pinned["samples"] == 10 and pinned["lineage"]["version"] == 0
    assert run("show", table, "--rows", "5").stdout.split(":")[0].endswith("@v1")
    assert sorted(p.name for p in Path(table).rglob("*")) == before  # nothing written there
    err = run("inspect", f"{table}@7", check=1).stderr
    assert "at version 7: no such version (versions available: 0..1)" in err


def test_inspect_and_show_a_delta_table_with_nulls(tmp_path: Path) -> None:
    """Nullable columns holding nulls (a null partition value too) are read masked: the
    samples show null, never the stored 0, and the output says the nulls are masked."""
    table = str(tmp_path / "scores")
    data = {"id": [1, 2, 3, 4], "score": [0.5, None, 2.0, None], "part": ["a", "a", None, "b"]}
    write_deltalake(table, pa.table(data), partition_by=["part"])
    info = json.loads(run("inspect", f"{table}@0", "--samples", "4", "--json").stdout)
    rows = sorted(info["sample_rows"], key=lambda r: r["id"])
    assert [r["score"] for r in rows] == [0.5, None, 2.0, None]
    assert [r["part"] for r in rows] == ["a", "a", None, "b"]
    assert info["spec"]["nulls"] == "mask" and info["samples"] == 4
    score = next(c for c in info["columns"] if c["name"] == "score")
    assert score["null_mask"] == "score__isnull"
    text = run("inspect", table, "--samples", "4").stdout
    assert "nulls: masked" in text and "score: float64 (double), nulls masked by" in text
    assert '"score": null' in text and "score__isnull" not in text.split("sample 0")[1]
    assert "@v0:" in text
    shown = run("show", f"{table}@v0").stdout  # the name as inspect prints it
    assert "nulls: masked" in shown and "score: float64, number, nulls 2; 0.5–2" in shown
    assert "part: str, text, nulls 1;" in shown
    run("show", table, "--html", str(tmp_path / "card.html"))
    assert "score" in (tmp_path / "card.html").read_text()


def test_inspect_reads_arrays_with_null_elements_as_json(tmp_path: Path) -> None:
    """An array column holding null elements (Spark's arrays may) has no ndarray form: it
    is read as json, and inspect and show say so instead of failing."""
    table = str(tmp_path / "lists")
    values = pa.array([[1, None], None, [3]], pa.list_(pa.int64()))
    write_deltalake(table, pa.table({"id": [1, 2, 3], "l": values}))
    info = json.loads(run("inspect", table, "--json").stdout)
    assert [r["l"] for r in info["sample_rows"]] == [[1, None], None, [3]]
    assert info["arrays_with_nulls_as_json"] == ["l"] and info["spec"]["columns"] == {"l": "json"}
    assert "read as json: l (arrays holding null elements" in run("inspect", table).stdout
    shown = run("show", table).stdout
    assert "read as json: l" in shown and "l: json, sequence, nulls 1;" in shown


def test_inspect_rows_new_since_a_version(tmp_path: Path) -> None:
    """``TABLE@M..N``: the rows new at N since M, read in place; a bad range names both."""
    table = str(tmp_path / "events")
    write_deltalake(table, pa.table({"id": list(range(10))}))
    write_deltalake(table, pa.table({"id": [10, 11, 12]}), mode="append")
    new = json.loads(run("inspect", f"{table}@0..1", "--json").stdout)
    assert new["samples"] == 3 and new["path"].endswith("@v0..v1")
    assert new["lineage"]["since"] == 0 and new["lineage"]["version"] == 1
    err = run("inspect", f"{table}@1..0", check=1).stderr
    assert "since=1 is after version=0" in err and table in err


def test_export_mode_update_follows_the_table(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"id": pa.array(range(50), pa.int64())}))
    write_deltalake(table, pa.table({"id": pa.array(range(50, 80), pa.int64())}), mode="append")
    out = str(tmp_path / "followed")
    args = ("--out", out, "--mode", "update", "--json", "--no-progress")
    first = json.loads(run("export", table, "--version", "0", *args).stdout)
    second = json.loads(run("export", table, "--version", "1", *args).stdout)
    assert (first["samples"], second["samples"]) == (50, 80)
    assert second["source"]["version"] == 1
    fresh = str(tmp_path / "fresh")
    full = json.loads(run("export", table, "--out", fresh, "--json", "--no-progress").stdout)
    assert full["fingerprint"] == second["fingerprint"]
    held = json.loads(run("inspect", f"{out}@0", "--json").stdout)
    assert held["samples"] == 50
    proc = run("export", table, "--version", "0", *args, check=1)
    assert "backwards" in proc.stderr and out in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_sums_up_the_shards_and_prints_dates(tmp_path: Path) -> None:
    """``inspect`` listed every shard (thousands of lines for a big dataset) where a
    summary is wanted, and printed dates and timestamps as the numbers they are stored as
    (days, microseconds). Now: one summary line, ``--shards`` for the list; dates as dates."""
    import datetime as dt

    from spark_dl_core import write_mds

    day = dt.date(2024, 2, 29)
    data = pa.table(
        {
            "id": list(range(200)),
            "day": pa.array([day + dt.timedelta(days=i) for i in range(200)], pa.date32()),
            "at": pa.array(
                [dt.datetime(2024, 2, 29, 12, 30, tzinfo=dt.timezone.utc)] * 200,
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    out = str(tmp_path / "ds")
    shards = write_mds(data, out, {"shard_size": 1024, "hashes": ["xxh64"]}).shards
    assert shards > 5
    text = run("inspect", out, "--samples", "2").stdout
    assert f"shards: {shards}, " in text and "(--shards lists them)" in text
    assert ".mds" not in text  # no shard file named
    assert '"day": "2024-02-29"' in text and '"day": "2024-03-01"' in text
    assert '"at": "2024-02-29 12:30:00+00:00"' in text
    listed = run("inspect", out, "--shards").stdout
    assert sum(".mds" in line for line in listed.splitlines()) == shards
    info = json.loads(run("inspect", out, "--json").stdout)
    assert "shards" not in info and info["shard_summary"]["hashes"] == ["xxh64"]
    assert info["sample_rows"][1]["day"] == "2024-03-01"
    assert len(json.loads(run("inspect", out, "--json", "--shards").stdout)["shards"]) == shards
