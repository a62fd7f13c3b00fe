"""make_tf_dataset: element_spec (dense, string, ragged), sharding, resume, model.fit."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from spark_dl_core import DatasetSpec, SpecError, open_dataset, write_mds  # noqa: E402
from spark_dl_core.loaders.tf_loader.loader import tf_state  # noqa: E402

N = 600


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tf") / "ds"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    lengths = np.arange(N) % 5 + 1
    table = pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "x": pa.array(list(x), type=pa.list_(pa.float32(), 4)),
            "y": pa.array((x.sum(axis=1) > 0).astype(np.float32)),
            "name": pa.array([f"n{i}" for i in range(N)]),
            "seq": pa.array([list(range(n)) for n in lengths], type=pa.list_(pa.int32())),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="4KiB", columns={"seq": "ndarray"}))
    return str(path)


def test_element_spec_and_values(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    tfds = ds.to_tf(batch_size=32)
    spec = tfds.element_spec
    assert spec["x"] == tf.TensorSpec((None, 4), tf.float32)
    assert spec["id"] == tf.TensorSpec((None,), tf.int64)
    assert spec["name"] == tf.TensorSpec((None,), tf.string)
    assert isinstance(spec["seq"], tf.RaggedTensorSpec)
    batch = next(iter(tfds))
    ids = batch["id"].numpy()
    assert list(ids) == list(range(32))
    assert [s.decode() for s in batch["name"].numpy()] == [f"n{i}" for i in ids]
    assert [len(r) for r in batch["seq"].to_list()] == [i % 5 + 1 for i in ids]
    assert int(tfds.cardinality()) == -(-N // 32)


def test_ranks_cover_dataset_and_match_torch_order(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    seen = []
    for rank in range(3):
        tfds = ds.to_tf(
            batch_size=16, shuffle=True, seed=4, rank=rank, world_size=3, columns=["id"]
        )
        seen += [i for b in tfds for i in b["id"].numpy().tolist()]
    assert sorted(seen) == list(range(N))
    one = [
        i
        for b in ds.to_tf(batch_size=16, shuffle=True, seed=4, columns=["id"])
        for i in b["id"].numpy().tolist()
    ]
    ref = [i for b in ds.iter_batches(16, shuffle=True, seed=4, columns=["id"]) for i in b["id"]]
    assert one == ref


def test_resume_from_state_at_other_world_size(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=20, shuffle=True, seed=8, columns=["id"])
    seen = []
    states = []
    for rank in range(2):  # 3 steps on each of 2 ranks
        tfds = ds.to_tf(rank=rank, world_size=2, **kw)
        it = iter(tfds)
        seen += [i for _ in range(3) for i in next(it)["id"].numpy().tolist()]
        states.append(tfds.state_dict(3))
    state = states[0]
    assert states[0] == states[1] and state["consumed"] == 3 * 2 * 20
    torch_state = {**state}  # the same state a torch loader saves and loads
    seen += [i for b in ds.to_tf(state=torch_state, **kw) for i in b["id"].numpy().tolist()]
    assert sorted(seen) == list(range(N))
    with pytest.warns(DeprecationWarning):  # old spellings: thin aliases of state=
        rest = [i for b in ds.to_tf(start_batch=5, **kw) for i in b["id"].numpy().tolist()]
        old = tf_state(ds, seed=8, epoch=0, consumed=3 * 2 * 20, shuffle=True, batch_size=20)
        again = [i for b in ds.to_tf(resume=old, **kw) for i in b["id"].numpy().tolist()]
    full = [i for b in ds.to_tf(**kw) for i in b["id"].numpy().tolist()]
    assert rest == full[100:] and again == full[120:]
    with pytest.raises(SpecError, match="seed"):
        ds.to_tf(batch_size=20, shuffle=True, seed=9, state=state)
    with pytest.raises(SpecError, match="num_workers"):
        ds.to_tf(batch_size=20, num_workers=2)  # a torch-only setting is refused, not dropped


def test_each_pass_is_the_next_epoch(ds_path: str) -> None:
    """Each pass over the tf.data.Dataset (each Keras epoch) is the next epoch's order."""
    ds = open_dataset(ds_path)
    kw = dict(batch_size=50, shuffle=True, seed=3, columns=["id"])

    def ids(tfds: object) -> list[int]:
        return [i for b in tfds for i in b["id"].numpy().tolist()]  # type: ignore[attr-defined]

    tfds = ds.to_tf(**kw)
    passes = [ids(tfds) for _ in range(3)]
    assert passes[0] != passes[1] != passes[2]
    for epoch, got in enumerate(passes):  # reproducible: the epoch-th epoch of the order
        want = [i for b in ds.iter_batches(epoch=epoch, **kw) for i in b["id"].tolist()]
        assert got == want
    assert passes == [ids(t) for t in [ds.to_tf(**kw)] for _ in range(3)]
    # A resumed first pass is the rest of its epoch; the second pass is the next epoch.
    state = ds.to_tf(**kw).state_dict(2)
    resumed = ds.to_tf(state=state, **kw)
    assert ids(resumed) == passes[0][100:] and ids(resumed) == passes[1]


def test_model_fit_one_epoch(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    tfds = ds.to_tf(batch_size=64, shuffle=True, seed=0, columns=["x", "y"], as_tuple=("x", "y"))
    model = tf.keras.Sequential(
        [tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    history = model.fit(tfds, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"][0])


def test_stats(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    tfds = ds.to_tf(batch_size=50, columns=["id", "x"])
    assert sum(int(b["id"].shape[0]) for b in tfds) == N
    stats = tfds.stats()
    assert stats["samples"] == N and stats["batches"] == -(-N // 50)
    assert stats["data_starved_pct"] is None and stats["samples_per_s"] > 0
    assert stats["workers"]["tf.data"]["read"] > 0


def test_booleans_are_tf_bool(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = pa.table({"flag": [True, False, True], "flags": pa.array([[True], [], [False, True]])})
    write_mds(table, str(tmp_path))
    (batch,) = open_dataset(tmp_path).to_tf(batch_size=3)
    assert batch["flag"].dtype == tf.bool
    assert batch["flag"].numpy().tolist() == [True, False, True]
    assert batch["flags"].dtype == tf.bool


def _png(height: int, width: int, seed: int) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "image_decode", "column": "image"}],
        [
            {"op": "image_decode", "column": "image"},
            {"op": "resize", "column": "image", "size": 12},  # shorter side: sizes still vary
            {"op": "normalize", "column": "image", "mean": 0.5, "std": 0.25},
            {"op": "to_chw", "column": "image"},
        ],
    ],
    ids=["decode", "resize-shorter-side"],
)
def test_decoded_images_of_different_sizes_are_ragged(tmp_path, ops) -> None:  # type: ignore[no-untyped-def]
    sizes = [(20, 30), (16, 16), (25, 18), (20, 30), (9, 31)]
    images = [_png(h, w, i) for i, (h, w) in enumerate(sizes)]
    path = str(tmp_path / "ds")
    write_mds(pa.table({"id": np.arange(len(sizes)), "image": images}), path)
    ds = open_dataset(path)
    tfds = ds.to_tf(batch_size=2, shuffle=False, transforms=ops)
    assert isinstance(tfds.element_spec["image"], tf.RaggedTensorSpec)
    got = [b["image"] for b in tfds]
    want = [
        v for b in ds.iter_batches(batch_size=2, shuffle=False, transforms=ops) for v in b["image"]
    ]
    assert {b.dtype.as_numpy_dtype for b in got} == {want[0].dtype.type}
    rows = [np.asarray(r) for batch in got for r in batch.to_list()]
    assert len(rows) == len(want) == len(sizes)
    for row, value in zip(rows, want):
        np.testing.assert_array_equal(row.astype(value.dtype), value)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"device": "cuda"}, ["device='cuda'", "TensorFlow", "tf.device"]),
        ({"device": "cpu"}, ["device='cpu'", "TensorFlow"]),
        ({"as_tuple": ("x", "ide")}, ["as_tuple", "'ide'", "did you mean 'id'"]),
        ({"as_tuple": ("x", "y", "id")}, ["as_tuple=('x', 'y', 'id')", "a pair"]),
        ({"as_tuple": "x"}, ["as_tuple='x'", "a pair"]),
        ({"as_tuple": True}, ["as_tuple=True", "a pair"]),
        ({"as_tuple": (["x", 3], "y")}, ["as_tuple", "a pair"]),
        ({"as_tuple": ([], "y")}, ["as_tuple", "non-empty"]),
    ],
)
def test_settings_tf_cannot_honour_are_refused_when_built(
    ds_path: str, kw: dict, words: list[str]
) -> None:
    """device is torch's (tf places tensors itself): refused, as to_torch refuses what it
    cannot honour; as_tuple mistakes are named when the dataset is built, not inside a
    traced function ("values to unpack", KeyError)."""
    ds = open_dataset(ds_path)
    with pytest.raises(SpecError) as caught:
        ds.to_tf(batch_size=32, **kw)
    for word in words:
        assert word in str(caught.value)


def test_as_tuple_lists_and_names(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    x, y = next(iter(ds.to_tf(batch_size=8, as_tuple=[["x", "id"], "y"])))
    assert sorted(x) == ["id", "x"] and y.shape == (8,)


@pytest.mark.parametrize("steps", [-1, 12, 100, "2", 2.5, True])
def test_state_dict_steps_outside_the_pass_are_refused(ds_path: str, steps: object) -> None:
    """The pass has 11 batches: state_dict(-1) gave consumed=-100 (refused only at load) and
    state_dict(100) was clamped to the epoch's end silently."""
    tfds = open_dataset(ds_path).to_tf(batch_size=55, columns=["id"])
    assert len(list(tfds)) == 11
    assert tfds.state_dict(11)["epoch"] == 1 and tfds.state_dict(0)["consumed"] == 0
    with pytest.raises(SpecError, match=r"state_dict\(steps=.*from 0 to 11"):
        tfds.state_dict(steps)
