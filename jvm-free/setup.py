"""Build of the optional C extension; everything else is in pyproject.toml.

``spark_dl_core._jpeg`` decodes a region of a JPEG at a reduced DCT scale over the system
libjpeg-turbo (Debian/Ubuntu: ``apt-get install libjpeg62-turbo-dev`` or
``libjpeg-turbo8-dev``). It is optional: without a compiler, the headers or the library the
build prints a warning and goes on, and images decode with simplejpeg or Pillow instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "spark_dl_core._jpeg",
            sources=["csrc/jpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
