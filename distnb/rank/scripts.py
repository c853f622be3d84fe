"""Running a script file on a rank as `python script.py args` would run it under torchrun.

`run_main` is what a `%dist_run` cell calls on every rank: the file runs as `__main__` in a
module of its own (so `if __name__ == "__main__":` fires and pickling `__main__` classes works),
with `sys.argv`, `sys.path[0]`, `__file__` and the working directory set as Python and torchrun set
them, in a process that looks as a fresh torchrun worker's (`distnb.rank.fresh`: the libraries it
imports are imported afresh, environment, logging, random state and torch's switches as the
rank had them when it joined), and everything put back afterwards for the cells. The rank's
torchrun environment and process group are already there (`distnb.rank.runtime`). A run of a
script again starts after its leading imports, made while the rank waited (`distnb.rank.ahead`).

The script and the modules beside it are the user's code wherever they lie (under site-packages
too: `distnb.userfiles`): call sites and hang reports name their lines. Tracebacks start at the
script's own frames: the cell and this module say nothing to the user. `sys.exit(0)` is a
normal end, as for a process.
"""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from typing import Any

from distnb.rank import ahead, asmain, checked, fresh
from distnb.rank.checked import callsite
from distnb.userfiles import script_paths

__all__ = ["ScriptExit", "run_main"]


class ScriptExit(Exception):
    """The script called `sys.exit(code)` with a code that means failure."""


def run_main(path: str, argv: Sequence[str], cwd: str | None = None) -> None:
    """Run the file at `path` as `__main__` with `sys.argv = argv`, in `cwd` if it exists here.

    Raises what the script raises, `ScriptExit` for `sys.exit(<non-zero>)`, and
    `FileNotFoundError` saying where it looked when this rank's host has no such file.
    """
    try:
        source = asmain.source_of(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no file {path} on this rank's host ({os.uname().nodename}): %dist_run needs the "
            "script at the same path on every host"
        ) from None
    taken = ahead.take(path, source, argv, cwd)
    if taken is None:
        ready, module, code = None, asmain.main_module(path), asmain.compiled(source, path)
    else:  # the script's imports are made: the rest of it runs from where they left
        ready, code = taken
        module = ready.module
    _tracebacks_from(path)
    callsite.set_user_paths(script_paths(path))
    checked.forget_groups()  # collectives count from #0 in each run, as in a new process group
    try:
        with (
            fresh.as_fresh(None if ready is None else ready.made),
            asmain.as_main(module, path, argv, cwd, folder_in_path=ready is not None),
        ):
            if ready is not None:
                ready.print_output()
            exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise ScriptExit(_exit_message(argv[0] if argv else path, exc.code)) from None
    finally:
        callsite.set_user_paths(())
        ahead.when_idle(path, argv, cwd)


def _exit_message(name: str, code: Any) -> str:
    if isinstance(code, int):
        return f"{name} exited with code {code} (sys.exit({code}))"
    # sys.exit("message") prints the message and exits with 1
    return f"{name} exited with code 1: {code}"


def _tracebacks_from(path: str) -> None:
    """Until the cell ends, the engine's IPython shows a failed run's traceback from the
    script's first frame (the cell and this module say nothing to the user). IPython's hook for
    this is a custom exception handler (`set_custom_exc`), which must display what it makes.
    Without IPython (tests, plain Python) nothing changes."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    saved = shell.custom_exceptions, shell.CustomTB

    def show(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> Any:
        if issubclass(etype, SyntaxError):  # the file itself: IPython's caret display
            stb = shell.SyntaxTB.structured_traceback(etype, value, None)
        else:
            stb = shell.InteractiveTB.structured_traceback(etype, value, _from_file(tb, path))
        shell._showtraceback(etype, value, stb)
        return stb

    def put_back(result: Any) -> None:
        shell.custom_exceptions, shell.CustomTB = saved
        shell.events.unregister("post_run_cell", put_back)

    shell.set_custom_exc((BaseException,), show)
    shell.events.register("post_run_cell", put_back)


def _from_file(tb: types.TracebackType | None, path: str) -> types.TracebackType | None:
    """The part of `tb` from the first frame in `path` on (None if no frame is there)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    return tb
