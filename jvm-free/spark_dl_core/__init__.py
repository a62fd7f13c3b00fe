"""spark-dl-core: Mosaic-compatible MDS datasets and reproducible loaders, without a JVM."""

from ._version import __version__
from .card import notebook_card as _notebook_card
from .errors import (
    DatasetError,
    EncodingError,
    HashMismatchError,
    MixtureError,
    ShardError,
    SparkDLError,
    SpecError,
    UnsafeEncodingError,
)
from .loaders import loading as _loading
from .loaders.settings import LoaderSettings, PackSpec
from .maintenance import VacuumReport, vacuum
from .mixture.dataset import Mixture
from .mixture.open import mix, open_mixture
from .mixture.spec import MixtureSpec, Source
from .sources.dataset import Dataset
from .sources.dataset import install as _install
from .spec import DatasetSpec, parse_size
from .store.indexing import write_compact_index
from .tables.delta.table import open_delta
from .tables.iceberg.table import open_iceberg
from .tables.kinds import open_dataset
from .writer import ShardWriter, WriteResult, write_mds

# The one hook: Dataset's loading methods (iter_batches / to_torch / to_tf / sample_order /
# to_arrow) and its notebook card (_repr_html_), from the rooms above it that build on it.
_install(loading=_loading, card=_notebook_card)


__all__ = [
    "Dataset",
    "DatasetError",
    "DatasetSpec",
    "EncodingError",
    "HashMismatchError",
    "LoaderSettings",
    "Mixture",
    "MixtureError",
    "MixtureSpec",
    "PackSpec",
    "ShardError",
    "ShardWriter",
    "Source",
    "SparkDLError",
    "SpecError",
    "UnsafeEncodingError",
    "VacuumReport",
    "WriteResult",
    "__version__",
    "mix",
    "open_dataset",
    "open_delta",
    "open_iceberg",
    "open_mixture",
    "parse_size",
    "vacuum",
    "write_compact_index",
    "write_mds",
]
