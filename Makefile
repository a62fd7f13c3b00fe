# spark-dl: one entry point for set-up, the demo, tests and benchmarks.
# Every target installs what it needs first, so a fresh clone needs only `make demo` / `make test`.

PYTHON ?= python3
VENV := .venv
PY := $(abspath $(VENV))/bin/python
MOSAIC_VENV := .venv-mosaic
JVM_JAR := spark_dl/jvm/spark-dl-jvm.jar
JVM_SOURCES := $(wildcard spark_dl/jvm/*.java)
DELTA_JARS := build/delta-jars
DELTA_PY := import spark_dl.delta_session as d; print(d
ICEBERG_JARS := build/iceberg-jars
ICEBERG_PY := import spark_dl.iceberg_session as i; print(i
# Spark's Python workers must run the interpreter that has our packages.
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
export SPARK_DL_MOSAIC_PYTHON := $(abspath $(MOSAIC_VENV))/bin/python
export TF_CPP_MIN_LOG_LEVEL := 2
# Delta Lake's jars for spark_dl.with_delta (fetched by Maven below)
export SPARK_DL_DELTA_JARS := $(abspath $(DELTA_JARS))
# Iceberg's Spark runtime for spark_dl.with_iceberg (fetched by Maven below)
export SPARK_DL_ICEBERG_JARS := $(abspath $(ICEBERG_JARS))

.PHONY: install mosaic-env browser-env fuse-env bench-envs demo test lint typecheck pytest bench bench-all fuzz clean

install: $(VENV)/.installed $(JVM_JAR) $(DELTA_JARS)/.fetched $(ICEBERG_JARS)/.fetched

$(VENV)/.installed: pyproject.toml jvm-free/pyproject.toml jvm-free/setup.py $(wildcard jvm-free/csrc/*.c) constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -c constraints.txt -e "./jvm-free[all]"
	# compat: the repository root goes on sys.path, where PySpark's discovery of top-level
	# pyspark_* modules (pkgutil over sys.path) finds pyspark_spark_dl; the default editable
	# finder makes it importable but invisible to that discovery
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]" --config-settings editable_mode=compat
	# PyPI's torch is the CUDA build, which brings triton (the GPU kernel compiler); imported
	# after TensorFlow (both bundle LLVM) it crashes the process, and on a CPU machine nothing
	# needs it (torch runs without it): leave it out
	$(PY) -m pip uninstall -q -y triton
	touch $@

# The JVM scan (docs/spark.md, "Reading"), compiled against PySpark's own jars. Where javac
# is missing (or fails) the jar is absent and format("mds") reads stay on the Python path.
$(JVM_JAR): $(JVM_SOURCES) $(VENV)/.installed
	@rm -rf build/jvm && mkdir -p build/jvm
	@if command -v javac >/dev/null 2>&1; then \
	  JARS=$$($(PY) -c "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))") && \
	  javac --release 17 -nowarn -d build/jvm -cp "$$JARS/*" $(JVM_SOURCES) && \
	  cd build/jvm && $(PY) -m zipfile -c $(abspath $@) sparkdl \
	  || echo "spark-dl: the JVM scan did not compile; format('mds') reads stay in Python"; \
	else echo "spark-dl: no javac; format('mds') reads stay on the Python path"; fi

# Delta Lake's jars (delta-spark for the pinned PySpark, and what it needs that PySpark does
# not ship), fetched once with the machine's Maven rather than by Ivy at every session start.
$(DELTA_JARS)/.fetched: spark_dl/jvm/delta/pom.xml $(VENV)/.installed
	@rm -rf $(DELTA_JARS) && mkdir -p $(DELTA_JARS)
	mvn -q -B -f spark_dl/jvm/delta/pom.xml $$($(PY) -c "$(DELTA_PY).maven_properties())") \
	  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(DELTA_JARS))
	$(PY) -c "$(DELTA_PY).prune_shipped('$(DELTA_JARS)'))"
	touch $@

# Iceberg's Spark runtime (one shaded jar) for the pinned PySpark, fetched once with the
# machine's Maven; where it was built for an older Spark (4.1's runtime on Spark 4.2) a small
# compatibility jar is built beside it with javac (spark_dl/jvm/iceberg/, docs/iceberg.md).
$(ICEBERG_JARS)/.fetched: spark_dl/jvm/iceberg/pom.xml $(wildcard spark_dl/jvm/iceberg/*.java) $(VENV)/.installed
	@rm -rf $(ICEBERG_JARS) && mkdir -p $(ICEBERG_JARS)
	mvn -q -B -f spark_dl/jvm/iceberg/pom.xml $$($(PY) -c "$(ICEBERG_PY).maven_properties())") \
	  dependency:copy-dependencies -DincludeScope=runtime -DexcludeTransitive=true \
	  -DoutputDirectory=$(abspath $(ICEBERG_JARS))
	$(PY) -c "$(ICEBERG_PY).build_compat('$(ICEBERG_JARS)'))"
	touch $@

# A side environment with Mosaic Streaming, the interoperability oracle. It cannot be the
# main one (it pins numpy<2.2); the library never depends on it. It sees the main
# environment's torch (and its 3 GB of CUDA libraries) through a .pth file instead of a second
# copy; its own pins (numpy...) come first on its path. triton goes, as in the main one.
mosaic-env: $(MOSAIC_VENV)/.installed

$(MOSAIC_VENV)/.installed: tests/interop/mosaic-requirements.txt $(VENV)/.installed
	rm -rf $(MOSAIC_VENV) && $(PYTHON) -m venv $(MOSAIC_VENV)
	$(call SITE,$(VENV)) > $$($(call SITE,$(MOSAIC_VENV)))/project.pth
	$(MOSAIC_VENV)/bin/python -m pip install -q -r tests/interop/mosaic-requirements.txt
	$(MOSAIC_VENV)/bin/python -m pip install -q --no-deps mosaicml-streaming==0.13.0
	$(MOSAIC_VENV)/bin/python -m pip uninstall -q -y triton
	touch $@

# Side environments for the anchors the benches measure (never needed by the library): each
# sees the main environment's packages (torch, numpy...) through a .pth file and adds its own
# (torch pinned as the main environment's).
LITDATA_VENV := .venv-litdata
ANCHORS_VENV := .venv-ray
SITE = $(1)/bin/python -c "import site; print(site.getsitepackages()[0])"
bench-envs: mosaic-env $(MOSAIC_VENV)/.s3 $(LITDATA_VENV)/.installed $(ANCHORS_VENV)/.installed

# Mosaic reads s3:// through boto3, which the interop oracle never needs (mosaic_shim stubs it):
# only the cluster egress bench's anchors add it, pinned as the main environment's.
$(MOSAIC_VENV)/.s3: $(MOSAIC_VENV)/.installed constraints.txt
	grep -E '^(boto3|botocore|jmespath|python-dateutil|s3transfer|six|urllib3)==' constraints.txt \
	  > $(MOSAIC_VENV)/s3-pins.txt
	$(MOSAIC_VENV)/bin/python -m pip install -q -r $(MOSAIC_VENV)/s3-pins.txt
	touch $@

$(LITDATA_VENV)/.installed: $(VENV)/.installed
	$(PYTHON) -m venv $(LITDATA_VENV)
	$(call SITE,$(VENV)) > $$($(call SITE,$(LITDATA_VENV)))/project.pth
	grep '^torch==' constraints.txt > $(LITDATA_VENV)/torch-pin.txt
	$(LITDATA_VENV)/bin/python -m pip install -q -c $(LITDATA_VENV)/torch-pin.txt litdata==0.2.76
	touch $@

$(ANCHORS_VENV)/.installed: $(VENV)/.installed
	$(PYTHON) -m venv $(ANCHORS_VENV)
	$(call SITE,$(VENV)) > $$($(call SITE,$(ANCHORS_VENV)))/project.pth
	grep '^torch==' constraints.txt > $(ANCHORS_VENV)/torch-pin.txt
	$(ANCHORS_VENV)/bin/python -m pip install -q -c $(ANCHORS_VENV)/torch-pin.txt "ray[data]==2.60.0" "daft==0.7.26"
	touch $@

# Debian's Chromium, for the dataset card's headless-browser test (tests/test_card.py); where
# it cannot be installed (no root or sudo, no apt) the test skips and says why.
browser-env:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO apt-get install -y -qq --no-install-recommends chromium; \
	} || echo "browser-env: chromium not installed; the headless-browser card test will skip"

# libfuse3 and fusermount3 (Debian's fuse3), for the test that mounts a real FUSE filesystem
# (tests/store/test_network_paths.py); where they cannot be installed, or the machine allows no
# mount, that test skips and says why.
fuse-env:
	@command -v fusermount3 >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  $$SUDO apt-get install -y -qq --no-install-recommends fuse3 || \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends fuse3; }; \
	} || echo "fuse-env: fuse3 not installed; the FUSE mount test will skip"

demo: install
	$(PY) -m spark_dl.demo

lint: install
	$(PY) -m ruff check jvm-free spark_dl pyspark_spark_dl.py tests bench
	$(PY) -m ruff format --check jvm-free spark_dl pyspark_spark_dl.py tests bench

typecheck: install
	$(PY) -m mypy jvm-free/spark_dl_core spark_dl pyspark_spark_dl.py

# Two processes side by side: the tests that start or share a JVM (marked `jvm` by
# tests/conftest.py: one Spark JVM, each session kind started once) and the rest. One process
# keeps about a third of the 2 cores busy. Servers the tests start take ports below the
# kernel's ephemeral range (tests/ports.py), which the other half's sockets are never given.
# The JVM half's output follows the other's; the slowest tests of each are listed.
pytest: install mosaic-env browser-env fuse-env
	@mkdir -p build
	@$(PY) -m pytest -q --durations=15 -m jvm tests > build/pytest-jvm.log 2>&1 & jvm=$$!; \
	$(PY) -m pytest -q --durations=15 -m "not jvm" tests; rest=$$?; \
	wait $$jvm; spark=$$?; \
	echo "== the tests that start or share a JVM (build/pytest-jvm.log) =="; \
	cat build/pytest-jvm.log; \
	[ $$rest -eq 0 ] && [ $$spark -eq 0 ]

test: lint typecheck pytest

bench: install
	$(PY) bench/format_bench.py

# Every shape's bench against its anchors, one after another: one table of ratios, dated,
# in bench-output/all.md (docs/performance.md quotes it). BENCH_ARGS=--quick for a smoke run.
bench-all: install bench-envs
	$(PY) bench/all.py $(BENCH_ARGS)

# Randomly corrupted datasets read in worker processes: prints the outcome counts.
FUZZ_CASES ?= 100000
fuzz: install
	$(PY) bench/fuzz.py --cases $(FUZZ_CASES)

clean:
	rm -rf $(VENV) $(MOSAIC_VENV) $(LITDATA_VENV) $(ANCHORS_VENV) .pytest_cache .mypy_cache .ruff_cache demo-output bench-output \
	  $(JVM_JAR) build/jvm $(DELTA_JARS)
