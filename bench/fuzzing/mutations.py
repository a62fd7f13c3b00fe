"""How one file of a dataset is corrupted: byte and bit flips, truncation, insertions,
deletions, JSON values of other types, removed keys, removed or emptied files. Every target
family mutates its files with these (Delta adds kinds of its own on top)."""

from __future__ import annotations

import json
import random
from typing import Any

KINDS = (
    "flip",
    "bit",
    "truncate",
    "insert",
    "delete",
    "json_type",
    "json_number",
    "json_key",
    "remove",
    "empty",
)


def json_nodes(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    nodes = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            nodes += json_nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            nodes += json_nodes(v, (*path, i))
    return nodes


def set_at(obj: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


OTHER_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    7,
    2**31,
    2**63,
    10**30,
    1.5,
    float("nan"),
    "",
    "x",
    "../../etc/passwd",
    [],
    [1, "a"],
    {},
    {"a": 1},
]


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes | None:
    """``data`` mutated by ``kind`` (None: remove the file)."""
    if kind == "remove":
        return None
    if kind == "empty":
        return b""
    if kind.startswith("json_"):
        try:
            obj = json.loads(data)
        except ValueError:
            kind = "flip"
        else:
            nodes = json_nodes(obj)
            target = rng.choice(nodes[1:] or nodes)
            if kind == "json_key" and target:
                obj = set_at(obj, target, None, delete=True)
            elif kind == "json_number":
                value: Any = rng.choice([0, -1, 1, 2**31, 2**62, 2**64, -(2**63), 3])
                numbers = [p for p in nodes if type(get_at(obj, p)) is int]
                if numbers:
                    target = rng.choice(numbers)
                    value = rng.choice([get_at(obj, target) + rng.choice([-1, 1]), value])
                obj = set_at(obj, target, value)
            else:
                obj = set_at(obj, target, rng.choice(OTHER_VALUES))
            return json.dumps(obj, indent=1, sort_keys=rng.random() < 0.5).encode()
    buf = bytearray(data)
    if not buf and kind != "insert":
        return bytes(rng.randbytes(rng.randint(1, 16)))
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == "bit":
        at = rng.randrange(len(buf))
        buf[at] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf)) :]
    elif kind == "insert":
        at = rng.randint(0, len(buf))
        buf[at:at] = rng.randbytes(rng.randint(1, 16))
    elif kind == "delete":
        at = rng.randrange(len(buf))
        del buf[at : at + rng.randint(1, 64)]
    return bytes(buf)


def get_at(obj: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        obj = obj[part]
    return obj
