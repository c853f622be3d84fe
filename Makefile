# Quick start: `make demo` runs distnb's demo, `make test` runs the test suite, `make check` the
# fast part of it (before each commit: lint and the check tier, a few minutes; tests/conftest.py).
# Each creates .venv on first use. CONSTRAINTS pins what this project's machines install (torch's
# CPU build, and every other package at the release the suite passed with); users installing
# distnb elsewhere get its loose ranges and bring their own torch.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c $(CONSTRAINTS)

.PHONY: demo test check lint docs lock bench bench-check compat compat-all clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) torch
	$(PIP) -e ".[test,docs]"
	if command -v mpicc >/dev/null 2>&1; then $(PIP) -e ".[mpi]"; fi
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/distnb demo

test: $(VENV)/.installed
	$(PY) -m pytest

# The fast tier for every commit: lint, then the tests marked `check` (tests/conftest.py says
# which: the tests without a tier marker, and a handful of cluster tests on one shared session).
check: $(VENV)/.installed lint
	$(PY) -m pytest -m check

lint: $(VENV)/.installed bench-check
	$(VENV)/bin/ruff check distnb harness tests bench
	$(VENV)/bin/ruff format --check distnb harness tests bench
	$(VENV)/bin/mypy

# The user guide as a site in site/ (mkdocs.yml), warnings as errors: a broken link, a page
# outside the nav or a docstring the API reference cannot read fails it.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site

# CONSTRAINTS' pins written again from the venv (its comments and torch's pin kept): after
# moving the venv to newer releases (`.venv/bin/pip install -U NAME`) and a passing `make test`.
lock: $(VENV)/.installed
	{ grep -E '^(#|torch==)' $(CONSTRAINTS); $(PY) -m pip freeze --exclude-editable \
	  | grep -v '^torch=='; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

# Every figure the README and docs/performance.md quote, re-derived from the benches' saved
# output in bench/results/ (no bench runs): fails naming the place of a figure that drifted.
bench-check:
	$(PYTHON) bench/check.py

# The compatibility run (.ci/compat): a test of every feature on the oldest and the newest
# torch distnb accepts and on the main venv's, each other release in a venv of its own under
# .compat/ (~8 GB while it runs: torch's CUDA builds); writes docs/compat.md and
# distnb/rank/tested.json, which `distnb doctor` reads. COMPAT_TORCH="2.11.0" runs other
# releases; `make compat-all` every minor release between the oldest and the newest.
compat: $(VENV)/.installed
	$(PYTHON) .ci/compat $(COMPAT_TORCH)

compat-all: $(VENV)/.installed
	$(PYTHON) .ci/compat all

# Each bench writes its output to bench/results/ (docs/performance.md quotes them all, with
# their commands); these are the quick ones.
bench: $(VENV)/.installed
	$(PY) bench/bench_session.py
	$(PY) bench/bench_memory.py

clean:
	rm -rf $(VENV) distnb-demo
