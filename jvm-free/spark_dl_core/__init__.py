"""spark-dl-core: Mosaic-compatible MDS datasets and reproducible loaders, without a JVM."""

from ._version import __version__
from .card import install as _install_card
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
from .loaders.loading import install as _install_loading
from .loaders.settings import LoaderSettings, PackSpec
from .maintenance import VacuumReport, vacuum
from .mixture.dataset import Mixture
from .mixture.open import mix, open_mixture
from .mixture.spec import MixtureSpec, Source
from .sources.dataset import Dataset, open_dataset
from .spec import DatasetSpec, parse_size
from .store.indexing import write_compact_index
from .tables.delta.follow_carry import install as _install_follow_carry
from .tables.delta.table import open_delta
from .tables.iceberg.table import open_iceberg
from .writer import ShardWriter, WriteResult, write_mds

_install_loading()  # Dataset.iter_batches / to_torch / to_tf / sample_order / to_arrow
_install_card()  # Dataset._repr_html_: the dataset card in notebooks
_install_follow_carry()  # followed datasets' loaders carry a run on to another version


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
