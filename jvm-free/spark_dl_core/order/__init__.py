"""The order of samples: pure functions of (fingerprint, seed, epoch, settings).

``dataset_order`` holds one dataset's lazy, two-level shuffled order; ``locality`` the order
drawn from fixed streams of shards; ``choice`` picks one for a source and its settings
(``streams=0``: automatic) and keeps it per dataset; ``mixture_order`` merges
sources by exact counts, ``mixture_streams`` draws that merge from fixed streams of every
source's shards; ``token_streams`` cuts whole shards into streams balanced by tokens and
deals global batches over streams of unequal lengths (packed loaders); ``plans`` deals an
epoch's global batches to ranks; ``state`` is the resume position; ``quality`` measures how
well an order is shuffled. Nothing here reads data or imports another room of the package.
"""

from .choice import global_order, resolve_streams
from .dataset_order import (
    DEFAULT_WINDOW,
    DENSE_WORLD,
    ORDER_VERSION,
    GlobalOrder,
    window_permute,
)
from .locality import (
    AUTO_STREAMS,
    DEFAULT_STREAMS,
    StreamedOrder,
    auto_streams,
    dataset_auto_streams,
    locality_report,
    rank_streams,
    stream_window,
)
from .mixture_order import (
    BATCHING,
    MixtureOrder,
    MixturePlan,
    ScheduledOrder,
    SchedulePart,
    merged_counts,
    merged_counts_at,
    proportional_counts,
    range_counts,
    schedule_parts,
    source_pieces,
)
from .mixture_streams import StreamedMixtureOrder, source_cut, split_counts
from .plans import EpochPlan
from .quality import shuffle_quality, step_spread
from .state import (
    LoaderState,
    epoch_position,
    epoch_start,
    epoch_total,
    plan_position,
    position_record,
    resolve_window,
)

__all__ = [
    "AUTO_STREAMS",
    "BATCHING",
    "DEFAULT_STREAMS",
    "DEFAULT_WINDOW",
    "DENSE_WORLD",
    "ORDER_VERSION",
    "EpochPlan",
    "GlobalOrder",
    "LoaderState",
    "MixtureOrder",
    "MixturePlan",
    "SchedulePart",
    "ScheduledOrder",
    "StreamedMixtureOrder",
    "StreamedOrder",
    "auto_streams",
    "dataset_auto_streams",
    "epoch_position",
    "epoch_start",
    "epoch_total",
    "global_order",
    "locality_report",
    "merged_counts",
    "merged_counts_at",
    "plan_position",
    "position_record",
    "proportional_counts",
    "range_counts",
    "rank_streams",
    "resolve_streams",
    "resolve_window",
    "schedule_parts",
    "shuffle_quality",
    "source_cut",
    "source_pieces",
    "split_counts",
    "step_spread",
    "stream_window",
    "window_permute",
]
