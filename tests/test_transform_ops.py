"""An unknown transform op is refused with the known ops and the closest one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_dl_core import DatasetSpec, open_dataset, write_mds
from spark_dl_core.errors import SpecError, SpecValidationError
from spark_dl_core.transforms import known_ops, parse_transforms


def test_known_ops_lists_every_op() -> None:
    ops = known_ops()
    assert {"select", "resize", "random_resized_crop", "to_chw"} <= set(ops)
    assert len(ops) == len(set(ops))


def test_misspelt_op_names_the_closest_and_the_known_ones() -> None:
    with pytest.raises(SpecError) as caught:
        parse_transforms([{"op": "resise", "column": "image", "size": 8}])
    text = str(caught.value)
    assert "unknown transform op 'resise' (did you mean 'resize'?)" in text
    assert "the ops are: " + ", ".join(known_ops()) in text
    assert "tagged-union" not in text and "pydantic" not in text and "type=" not in text


def test_unknown_op_in_a_dataset_spec_names_the_field() -> None:
    with pytest.raises(SpecValidationError) as caught:
        DatasetSpec(transforms=[{"op": "select", "columns": ["a"]}, {"op": "dorp"}])
    assert caught.value.fields == ["transforms.1"]
    assert "unknown transform op 'dorp' (did you mean 'drop'?)" in str(caught.value)
    assert "tagged-union" not in str(caught.value)


def test_missing_op_and_bad_fields_are_short(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"a transform names its op .*the ops are: select"):
        parse_transforms([{"column": "x"}])
    with pytest.raises(SpecError, match=r"unknown transform op 'zzz'; the ops are"):
        parse_transforms({"op": "zzz"})
    with pytest.raises(SpecError, match=r"resize\.column: Field required") as caught:
        parse_transforms([{"op": "resize", "size": 8}])
    assert "errors.pydantic.dev" not in str(caught.value)
    # the loaders refuse it the same way, before any batch
    path = str(tmp_path / "ds")
    write_mds(pa.table({"x": np.arange(4)}), path)
    with pytest.raises(SpecError, match=r"did you mean 'normalize'"):
        next(iter(open_dataset(path).iter_batches(2, transforms=[{"op": "normalise"}])))
