"""One public surface, and `import distnb` stays cheap."""

from __future__ import annotations

import inspect
import subprocess
import sys

import distnb


def test_the_public_surface_is_pinned() -> None:
    assert distnb.__all__ == [
        "Session",
        "attach",
        "check_finite",
        "diff_replicas",
        "load_ipython_extension",
        "start",
        "unchecked",
    ]
    for name in distnb.__all__:
        assert getattr(distnb, name) is not None
    # dir() shows what a user may use, not the module's imports
    assert sorted(dir(distnb)) == sorted(
        [*distnb.__all__, "__version__", "unload_ipython_extension"]
    )
    assert distnb.Session.__module__ == distnb.start.__module__ == "distnb"


def test_start_is_one_function_with_its_signature() -> None:
    from distnb.session import options, start

    assert distnb.start is start  # one signature and docstring, handed on lazily
    assert inspect.signature(start).parameters["register_timeout"].default == (
        options.REGISTER_TIMEOUT_S
    )
    params = inspect.signature(distnb.start).parameters
    assert list(params) == [
        "n", "backend", "timeout", "engines", "host", "check", "progress", "register_timeout",
        "hosts", "python", "ssh_args", "slurm",
    ]  # fmt: skip
    assert all(p.kind is p.KEYWORD_ONLY for name, p in params.items() if name != "n")
    assert "Example" in (distnb.start.__doc__ or "") or ">>>" in (distnb.start.__doc__ or "")


def test_import_loads_no_torch_ipyparallel_or_widgets() -> None:
    code = (
        "import sys, distnb, distnb.errors, distnb.records.collective, distnb.judgement\n"
        "heavy = {'torch', 'ipyparallel', 'ipywidgets', 'matplotlib', 'IPython'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
