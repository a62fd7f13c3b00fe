"""A free TCP port on loopback for a server a test starts in another process.

Why not ``bind(("127.0.0.1", 0))``: that hands out a port from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), which any other
process (a Spark JVM in a second pytest process, gloo's own connections) may be given
between the test closing its probe and the server binding it. Ports below that range are
never handed out by the kernel, so only a process choosing one by number could take it.
"""

from __future__ import annotations

import random
import socket

_LOW, _HIGH = 20000, 32767  # under the kernel's default ephemeral range


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _HIGH + 1


def free_port() -> int:
    """A port on 127.0.0.1 no one listens on now, outside the kernel's ephemeral range."""
    high = min(_HIGH, _ephemeral_low() - 1)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(_LOW, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {_LOW}-{high}")
