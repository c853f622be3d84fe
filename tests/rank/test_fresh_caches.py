"""A run takes transformers' `import_utils` (its lazy import structure, built by reading every
model folder) from an earlier run that imported it in the same setting, and imports everything
else afresh (`distnb.rank.fresh.caches`). In this very process, with the real transformers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from distnb.rank import fresh
from distnb.rank.fresh.caches import KEPT, CacheFinder

CACHE = "transformers.utils.import_utils"


@pytest.fixture
def joined() -> Iterator[None]:
    """A rank joined before transformers was imported (an earlier test may have imported it
    here: it is set aside, and back after)."""
    aside = {n: m for n, m in sys.modules.items() if n.partition(".")[0] == "transformers"}
    for name in aside:
        del sys.modules[name]
    fresh.remember()
    yield
    fresh.forget()
    for name in [n for n in sys.modules if n.partition(".")[0] == "transformers"]:
        del sys.modules[name]
    sys.modules.update(aside)


def _run(code: str = "") -> tuple[Any, Any, int]:
    """A run that imports transformers (and runs `code` after): (transformers, its import_utils,
    how many times the import structure came from its cache)."""
    with fresh.as_fresh():
        import transformers
        import transformers.utils.import_utils as utils

        exec(code, {"utils": utils, "os": os})
        return transformers, utils, utils.define_import_structure.cache_info().hits


def test_a_run_reuses_the_import_structure_and_imports_transformers_afresh(joined: None) -> None:
    first, first_utils, hits = _run("utils.is_torch_available = lambda: 'patched'")
    second, second_utils, hits_after = _run()
    assert second is not first  # transformers itself: afresh, its singletons empty
    assert second_utils is first_utils  # the cache module: the earlier run's
    assert second_utils.is_torch_available() is True  # the first run's patch is gone
    assert hits_after > hits  # the structure is not read again
    assert CACHE not in sys.modules  # the cells never imported it: not theirs now
    assert not any(isinstance(f, CacheFinder) for f in sys.meta_path)  # a cell imports as ever


def _import_under(variable: str | None) -> Any:
    """A run that sets `variable` (none: sets nothing) and then imports the cache module."""
    with fresh.as_fresh():
        if variable is not None:
            os.environ[variable] = "1"  # as a script sets one before its imports
        import transformers.utils.import_utils as utils

        return utils


def test_a_run_whose_environment_differs_at_the_import_gets_a_copy_of_its_own(
    joined: None,
) -> None:
    plain = _import_under(None)
    other = _import_under("DISTNB_CACHE_TEST")  # Lightning sets a variable before its import
    assert other is not plain
    assert _import_under(None) is plain and _import_under("DISTNB_CACHE_TEST") is other
    assert "DISTNB_CACHE_TEST" not in os.environ
    for n in range(KEPT):  # the copies least recently used go first
        _import_under(f"DISTNB_CACHE_TEST_{n}")
    assert _import_under("DISTNB_CACHE_TEST") is not other
