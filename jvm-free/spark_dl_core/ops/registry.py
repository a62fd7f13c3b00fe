"""Where each transform op is implemented: the rooms register their work here.

The ops themselves are declared in :mod:`spark_dl_core.ops.transforms` (pydantic models, the
spec's vocabulary). The work of the ops that need a medium's libraries (image, audio, video
codecs) lives in the media rooms, which import this registry and call :func:`register_op`
when imported; nothing here or in the transforms imports them. :func:`implementation`
imports the module named in :data:`IMPLEMENTATION_MODULES` the first time an op is used
(as :mod:`spark_dl_core.loaders.frameworks` finds loaders), so a write or a loader only loads the
rooms its ops need.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import SpecError

# op name -> the module that registers its implementation when imported.
IMPLEMENTATION_MODULES = {
    "reencode_image": "spark_dl_core.media.image_codec",  # write ops: a function over a column
    "reencode_audio": "spark_dl_core.media.audio_codec",
    "reencode_video": "spark_dl_core.media.video_codec",
    "image_decode": "spark_dl_core.media.images",  # decode ops: a pipeline factory (op, column)
    "audio_decode": "spark_dl_core.media.clips",
    "video_decode": "spark_dl_core.media.clips",
}
_IMPLEMENTATIONS: dict[str, Any] = {}


def register_op(name: str, implementation: Any) -> None:
    """Make ``implementation`` the work behind op ``name`` (what it is depends on the op's
    kind: a function over an Arrow column for write ops, a pipeline class for decodes)."""
    _IMPLEMENTATIONS[name] = implementation


def implementation(name: str) -> Any:
    """The registered implementation of op ``name``, importing its module if needed."""
    if name not in _IMPLEMENTATIONS and name in IMPLEMENTATION_MODULES:
        importlib.import_module(IMPLEMENTATION_MODULES[name])
    try:
        return _IMPLEMENTATIONS[name]
    except KeyError:
        raise SpecError(f"no implementation is registered for transform op {name!r}") from None
