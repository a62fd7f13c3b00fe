"""Local paths that are remote storage: network and FUSE mounts.

A path under an NFS, SMB, Lustre or FUSE mount (Databricks' ``/Volumes`` and
``/Workspace``, s3fs, gcsfuse, blobfuse) looks local but every read crosses the network, so
reading a dataset there in place re-reads it from the network every epoch. Such paths are
read through the node cache as ``s3://`` URLs are (:func:`~.cached_store.shard_store`).
The mount table (``/proc/self/mountinfo``, Linux) says which filesystem holds a path.
"""

from __future__ import annotations

import os

# Filesystem types whose reads cross the network (FUSE: any ``fuse`` or ``fuse.*`` type,
# since most FUSE filesystems front remote storage).
NETWORK_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "ceph",
        "glusterfs",
        "9p",
        "gpfs",
        "beegfs",
        "afs",
        "davfs",
        "sshfs",
        "fuse",
        "fuseblk",
    }
)
MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    """A mount table field with its octal escapes (``\\040`` for a space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each line of a ``mountinfo`` table: the mount
    point is its fifth field, the type the first after the ``-`` separator."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        at = fields.index("-", 6)
        if len(fields) > at + 1:
            found.append((_unescape(fields[4]), fields[at + 1]))
    return found


def is_network_type(fstype: str) -> bool:
    return fstype in NETWORK_TYPES or fstype.startswith("fuse.")


def network_mount(path: str, table: str | None = None) -> tuple[str, str] | None:
    """(mount point, type) of the network or FUSE mount holding ``path``, or None: a local
    filesystem, or no mount table to read (not Linux). ``table``: a ``mountinfo`` text
    (default: this process's)."""
    if table is None:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
                table = f.read()
        except OSError:
            return None
    real = os.path.realpath(path)
    best: tuple[str, str] | None = None
    for point, fstype in mounts(table):
        inside = real == point or real.startswith(point.rstrip("/") + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)  # the last of equal mount points is the one on top
    return best if best is not None and is_network_type(best[1]) else None
