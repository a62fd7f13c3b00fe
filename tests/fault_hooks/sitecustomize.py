"""Test-only crash hook for the driver-death tests in ``tests/spark/test_spark_faults.py``.

That test puts this directory first on ``PYTHONPATH`` of a driver it is going to kill;
Spark passes ``PYTHONPATH`` on to the Python workers the driver starts, so Python imports
this module at start-up in the driver and in the worker that runs the data source's commit.
It does nothing unless ``SPARK_DL_TEST_CRASH_BEFORE=<file name>`` is set: then, right before
any :class:`spark_dl_core.store.storage.Store` writes that file, it creates
``$SPARK_DL_TEST_CRASH_MARKER.<pid>`` and waits, so the test can SIGKILL the whole process
tree at exactly that point of the commit. Nothing of this ships with the library.
"""

from __future__ import annotations

import os

if os.environ.get("SPARK_DL_TEST_CRASH_BEFORE"):
    import time
    from typing import Any

    from spark_dl_core.store.storage import Store

    _write_bytes = Store.write_bytes

    def _crash_before(self: Store, name: str, data: Any) -> None:
        if name == os.environ.get("SPARK_DL_TEST_CRASH_BEFORE"):
            marker = f"{os.environ['SPARK_DL_TEST_CRASH_MARKER']}.{os.getpid()}"
            with open(marker + ".tmp", "w") as f:
                f.write(self.root)
            os.replace(marker + ".tmp", marker)
            time.sleep(120)  # killed long before; never write if the test forgot to
            os._exit(1)
        _write_bytes(self, name, data)

    Store.write_bytes = _crash_before  # type: ignore[method-assign]
