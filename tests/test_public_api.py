"""One public surface, and `import distnb` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import distnb


def test_all_is_short_sorted_and_importable() -> None:
    assert distnb.__all__ == sorted(distnb.__all__)
    for name in distnb.__all__:
        assert getattr(distnb, name) is not None


def test_import_loads_no_torch_ipyparallel_or_widgets() -> None:
    code = (
        "import sys, distnb, distnb.errors, distnb.records.collective, distnb.matching\n"
        "heavy = {'torch', 'ipyparallel', 'ipywidgets', 'matplotlib', 'IPython'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
