"""How a script is split for its imports made ahead (`distnb.rank.ahead`): the leading imports,
and the rest, which runs as the file would, line numbers and `__future__` imports kept."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from distnb.rank import ahead, asmain

SCRIPT = '''\
"""A script."""
from __future__ import annotations
import os
from collections import OrderedDict as Ordered

SEEN = os.environ.get("AHEAD_TEST")
import json  # after another statement: the run imports it


def f(x: Undefined) -> None:  # annotations unevaluated: the future import holds
    raise ValueError("line 11")


f(1)
'''


def test_the_leading_imports_are_split_from_the_rest_which_runs_as_the_file(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "script.py")
    parts = ahead._split(SCRIPT.encode(), path)
    assert parts is not None
    imports, rest = (asmain.compiled(part, path) for part in parts)
    names: dict[str, object] = {"__name__": "__main__"}
    exec(imports, names)
    assert {"os", "Ordered"} <= names.keys() and "json" not in names and "SEEN" not in names
    (tmp_path / "script.py").write_text(SCRIPT)
    with pytest.raises(ValueError, match="line 11") as info:
        exec(rest, names)
    assert names["__doc__"] == "A script." and "json" in names
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [(f.filename, f.lineno) for f in frames[-2:]] == [(path, 14), (path, 11)]


@pytest.mark.parametrize(
    "source",
    ['"""Only a docstring."""\nprint(1)\n', "x = 1\nimport os\n", "import (\n", b"\xff\xfe"],
)
def test_a_script_without_leading_imports_or_that_does_not_compile_is_not_split(
    source: str | bytes,
) -> None:
    encoded = source if isinstance(source, bytes) else source.encode()
    assert ahead._split(encoded, "script.py") is None
