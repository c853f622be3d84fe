# Quick start: `make demo` runs distnb's demo, `make test` runs the test suite.
# Both create .venv on first use. CONSTRAINTS pins torch to the build this project is tested
# with; users installing distnb elsewhere bring their own torch.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c $(CONSTRAINTS)

.PHONY: demo test lint bench compat clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) torch
	$(PIP) -e ".[test]"
	if command -v mpicc >/dev/null 2>&1; then $(PIP) -e ".[mpi]"; fi
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/distnb demo

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check distnb tests bench
	$(VENV)/bin/ruff format --check distnb tests bench
	$(VENV)/bin/mypy

# The compatibility run: the tests on the oldest and the newest torch distnb accepts, each in a
# venv of its own under .compat/ (~8 GB each: torch's CUDA builds); writes docs/compat.md.
# COMPAT_TORCH="2.11.0" runs other versions without recording them.
compat:
	$(PYTHON) .ci/compat $(COMPAT_TORCH)

bench: $(VENV)/.installed
	$(PY) bench/bench_session.py
	$(PY) bench/bench_memory.py

clean:
	rm -rf $(VENV) distnb-demo
