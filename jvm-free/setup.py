"""Build of the optional C extensions; everything else is in pyproject.toml.

``spark_dl_core.media._jpeg`` decodes a region of a JPEG at a reduced DCT scale over the system
libjpeg-turbo (Debian/Ubuntu: ``apt-get install libjpeg62-turbo-dev`` or
``libjpeg-turbo8-dev``). ``spark_dl_core.format._buffers`` copies a batch's byte ranges (token
documents), or its fixed-width rows from several shards, in one call.
``spark_dl_core.order._shuffle`` builds a stratified mixture's batches from its sources' runs
and shuffles each with its own keyed generator, in one call.
``spark_dl_core.loaders._packing`` places bin packing's documents by best fit. Each lives in
the room that uses it. All are optional: without a compiler, headers or library the build
prints a warning and goes on, and the pure numpy / simplejpeg / Pillow / Python paths run
instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "spark_dl_core.media._jpeg",
            sources=["csrc/jpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "spark_dl_core.format._buffers",
            sources=["csrc/buffers.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "spark_dl_core.order._shuffle",
            sources=["csrc/shuffle.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "spark_dl_core.loaders._packing",
            sources=["csrc/packing.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ]
)
