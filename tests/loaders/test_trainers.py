"""Inside the trainers people use: PyTorch Lightning (one device and 2-process DDP), Hugging
Face Accelerate and Keras ``fit`` reshuffle every epoch, keep ranks disjoint and resume a
mid-epoch checkpoint with exactly the rest of the epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from ports import free_port

torch = pytest.importorskip("torch")

from spark_dl_core import DatasetSpec, SpecError, open_dataset, write_mds  # noqa: E402

N = 640  # 10 batches of 64 on one rank, 5 on each of 2


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("trainers") / "ds"
    x = np.random.default_rng(0).standard_normal((N, 2)).astype(np.float32)
    table = pa.table(
        {
            "id": pa.array(np.arange(N, dtype=np.int64)),
            "x": pa.array(list(x)),
            "y": pa.array((x[:, 0] > 0).astype(np.float32)),
        }
    )
    write_mds(table, str(path), DatasetSpec(shard_size="4KiB"))
    return str(path)


# --------------------------------------------------------------------------- the rules


def test_a_pass_that_delivered_len_batches_is_finished(ds_path: str) -> None:
    """Trainers stop after len() batches without exhausting the iterator."""
    ds = open_dataset(ds_path)
    kw = dict(batch_size=64, shuffle=True, seed=1, columns=["id"])
    loader = ds.to_torch(**kw)
    epochs = []
    for _ in range(3):
        it = iter(loader)
        epochs.append(torch.cat([next(it)["id"] for _ in range(len(loader))]).tolist())
    assert all(sorted(e) == list(range(N)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # a new order every epoch
    assert epochs[2] == [i for b in ds.to_torch(epoch=2, **kw) for i in b["id"].tolist()]


def test_sampler_set_epoch_and_abandoned_iterators(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=64, shuffle=True, seed=1, columns=["id"])
    epoch1 = [b["id"] for b in ds.to_torch(epoch=1, **kw)]
    loader = ds.to_torch(**kw)
    it = iter(loader)
    for _ in range(3):  # a pass left early (limit_train_batches)
        next(it)
    for _ in range(3):
        iter(loader)  # iter() with no batches taken: changes nothing
    loader.sampler.set_epoch(1)  # what Lightning calls before each epoch
    assert loader.sampler.epoch == 1 and len(loader) == 10
    iter(loader)
    got = list(loader)
    assert all(torch.equal(a["id"], b) for a, b in zip(got, epoch1)) and len(got) == 10
    loader.sampler.set_epoch(2)  # the finished pass already moved there: a no-op
    assert loader.epoch == 2 and loader.state_dict()["consumed"] == 0


def test_len_is_the_epochs_and_resume_delivers_the_rest(ds_path: str) -> None:
    ds = open_dataset(ds_path)
    kw = dict(batch_size=64, shuffle=True, seed=1, columns=["id"])
    full = [b["id"] for b in ds.to_torch(**kw)]
    loader = ds.to_torch(**kw)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    resumed = ds.to_torch(**kw)
    resumed.load_state_dict(state)
    assert len(resumed) == 10 and resumed.remaining == 6
    # A trainer that counts its own progress (4 done) stops at len(): it asks for 6 more.
    it = iter(resumed)
    rest = [next(it)["id"] for _ in range(len(resumed) - 4)]
    assert all(torch.equal(a, b) for a, b in zip(rest, full[4:]))
    assert resumed.epoch == 1 and len(resumed) == 10 and resumed.remaining == 10
    with pytest.raises(SpecError, match="seed"):  # another order's state is refused
        ds.to_torch(batch_size=64, shuffle=True, seed=2).load_state_dict(state)


# --------------------------------------------------------------------------- Lightning


_LIGHTNING = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import pytorch_lightning as pl
from spark_dl_core import open_dataset

path, out, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])


class Model(pl.LightningModule):
    def __init__(self, loader_kw):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.loader_kw = loader_kw
        self.seen = []

    def train_dataloader(self):
        return open_dataset(path).to_torch(**self.loader_kw)

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch_idx, batch["id"].tolist()])
        pred = self.layer(batch["x"]).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(pred, batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(max_epochs, callbacks=()):
    return pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        max_epochs=max_epochs, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks), num_sanity_val_steps=0,
    )


kw = dict(batch_size=64, shuffle=True, seed=1, columns=["id", "x", "y"])
ckpt = pl.callbacks.ModelCheckpoint(
    dirpath=os.path.join(out, "ckpt"), every_n_train_steps=3, save_top_k=-1,
    filename="{step}",
)
model = Model(kw)
trainer(2, [ckpt]).fit(model)
# Resume the step-3 checkpoint (mid-epoch 0) and train the rest of that epoch.
again = Model(kw)
trainer(1).fit(again, ckpt_path=os.path.join(out, "ckpt", "step=3.ckpt"))
# The step-6 checkpoint: epoch 0 on one device, epoch 1 after a step on two; train it out.
later = Model(kw)
trainer(2).fit(later, ckpt_path=os.path.join(out, "ckpt", "step=6.ckpt"))
state = torch.load(os.path.join(out, "ckpt", "step=3.ckpt"), weights_only=False)
refused = None
if devices == 1:  # a checkpoint of another order is refused, not silently restarted
    from spark_dl_core import SpecError
    try:
        trainer(1).fit(Model({**kw, "seed": 2}), ckpt_path=os.path.join(out, "ckpt", "step=3.ckpt"))
    except SpecError as exc:
        refused = str(exc)
rank = int(os.environ.get("LOCAL_RANK", 0))
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"first": model.seen, "resumed": again.seen, "later": later.seen, "refused": refused,
               "state": state["loops"]["fit_loop"]["state_dict"]["combined_loader"]}, f)
"""


def _lightning(ds_path: str, tmp_path: Path, devices: int) -> list[dict[str, Any]]:
    pytest.importorskip("pytorch_lightning")
    script = tmp_path / "fit.py"
    script.write_text(_LIGHTNING)
    env = {**os.environ, "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, str(script), ds_path, str(tmp_path), str(devices)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(devices)]


def _check_lightning(runs: list[dict[str, Any]], steps: int) -> None:
    for run in runs:
        epochs = [[row for row in run["first"] if row[0] == e] for e in (0, 1)]
        assert [len(e) for e in epochs] == [steps, steps]
        assert [row[1] for row in epochs[0]] == list(range(steps))
        assert run["state"][0]["consumed"] == 3 * 64 * len(runs)  # after 3 steps per rank
        # Resumed at step 3: exactly the rest of epoch 0, the same batches.
        assert [row[1] for row in run["resumed"]] == list(range(3, steps))
        assert [row[2] for row in run["resumed"]] == [row[2] for row in epochs[0][3:]]
        assert run["later"] == run["first"][6:]  # the same rows, epochs and batch indices
    for e in (0, 1):  # each epoch: every sample once over the ranks
        ids = [i for run in runs for row in run["first"] if row[0] == e for i in row[2]]
        assert sorted(ids) == list(range(N))
    orders = [
        [i for run in runs for row in run["first"] if row[0] == e for i in row[2]] for e in (0, 1)
    ]
    assert orders[0] != orders[1]  # reshuffled per epoch


@pytest.mark.slow
def test_lightning_one_device(ds_path: str, tmp_path: Path) -> None:
    runs = _lightning(ds_path, tmp_path, 1)
    _check_lightning(runs, steps=10)
    assert "seed" in runs[0]["refused"]


@pytest.mark.slow
def test_lightning_ddp_two_processes(ds_path: str, tmp_path: Path) -> None:
    runs = _lightning(ds_path, tmp_path, 2)
    _check_lightning(runs, steps=5)
    for e in (0, 1):  # ranks disjoint
        a, b = ({i for row in run["first"] if row[0] == e for i in row[2]} for run in runs)
        assert not a & b


# --------------------------------------------------------------------------- Accelerate


_ACCELERATE = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
from accelerate import Accelerator
from spark_dl_core import open_dataset

path, out = sys.argv[1], sys.argv[2]
accelerator = Accelerator(cpu=True)
assert accelerator.num_processes == 2
loader = open_dataset(path).to_torch(
    batch_size=48, shuffle=True, seed=3, columns=["id", "x", "y"], pad_mask=True
)
model, opt = torch.nn.Linear(2, 1), None
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, prepared = accelerator.prepare(model, opt, loader)
seen = []
for epoch in range(2):
    rows = []
    for batch in prepared:
        pred = model(batch["x"]).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(pred, batch["y"])
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        rows.append(batch["id"][~batch["pad_mask"]].tolist())
    seen.append(rows)
with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump({"seen": seen, "same": prepared is loader, "len": len(prepared)}, f)
accelerator.wait_for_everyone()
accelerator.end_training()  # destroys the process group: gloo's threads abort an exit without it
"""


@pytest.mark.slow
def test_accelerate_prepare_two_processes(ds_path: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    script = tmp_path / "acc.py"
    script.write_text(_ACCELERATE)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_port", str(free_port()), str(script), ds_path, str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(run["same"] for run in runs)  # prepare() passes the loader through
    assert [len(run["seen"][e]) for run in runs for e in (0, 1)] == [runs[0]["len"]] * 4
    orders = []
    for e in (0, 1):
        a, b = ([i for rows in run["seen"][e] for i in rows] for run in runs)
        assert not set(a) & set(b) and sorted(a + b) == list(range(N))
        orders.append(a + b)
    assert orders[0] != orders[1]


# --------------------------------------------------------------------------- Keras


def test_keras_fit_several_epochs(ds_path: str) -> None:
    tf = pytest.importorskip("tensorflow")
    ds = open_dataset(ds_path)
    seen: list[list[int]] = []

    class Recorder(tf.keras.Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.dense = tf.keras.layers.Dense(1, activation="sigmoid")

        def call(self, inputs: Any) -> Any:
            return self.dense(inputs["x"])

        def train_step(self, data: Any) -> Any:
            seen[-1].extend(data[0]["id"].numpy().tolist())
            return super().train_step(data)

    class NewEpoch(tf.keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            seen.append([])

    kw = dict(batch_size=64, shuffle=True, seed=2, columns=["id", "x", "y"])
    tfds = ds.to_tf(as_tuple=(["x", "id"], "y"), **kw)
    model = Recorder()
    model.compile(optimizer="sgd", loss="binary_crossentropy", run_eagerly=True)
    history = model.fit(tfds, epochs=3, verbose=0, callbacks=[NewEpoch()])
    assert history.params["steps"] == int(tfds.cardinality()) == 10
    want = [[i for b in ds.iter_batches(epoch=e, **kw) for i in b["id"].tolist()] for e in range(3)]
    assert seen == want and len({tuple(s) for s in seen}) == 3  # epochs 0, 1, 2 in order
    # A later fit continues with the next epoch (each pass over tfds is the next one).
    seen.clear()
    model.fit(tfds, epochs=1, verbose=0, callbacks=[NewEpoch()])
    assert seen == [[i for b in ds.iter_batches(epoch=3, **kw) for i in b["id"].tolist()]]
    # steps_per_epoch = the cardinality over a repeated dataset: each repetition is the
    # next epoch, so Keras's epochs and the loader's stay aligned.
    seen.clear()
    again = ds.to_tf(as_tuple=(["x", "id"], "y"), **kw).repeat()
    model.fit(again, epochs=2, steps_per_epoch=10, verbose=0, callbacks=[NewEpoch()])
    assert seen == want[:2]
