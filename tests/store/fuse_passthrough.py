"""A read-only FUSE passthrough of a directory (mfusepy over libfuse3), run in its own
process: ``python fuse_passthrough.py SOURCE MOUNTPOINT`` serves SOURCE's files at
MOUNTPOINT until unmounted (``fusermount3 -u``). Every read goes through the FUSE daemon,
as on s3fs, gcsfuse or Databricks' /Volumes."""

from __future__ import annotations

import os
import sys
from typing import Any

import mfusepy as fuse

STAT = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
STATVFS = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")


class Passthrough(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, root: str) -> None:
        self.root = root
        self.reads = 0

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._path(path))
        except FileNotFoundError:
            raise fuse.FuseOSError(2) from None
        out = {k: getattr(st, k) for k in STAT}
        for key in ("st_atime", "st_ctime", "st_mtime"):  # use_ns: times in nanoseconds
            out[key] = getattr(st, key + "_ns")
        return out

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def open(self, path: str, flags: int) -> int:
        return os.open(self._path(path), flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._path(path))
        return {k: getattr(st, k) for k in STATVFS}


if __name__ == "__main__":
    fuse.FUSE(Passthrough(sys.argv[1]), sys.argv[2], foreground=True, ro=True)
