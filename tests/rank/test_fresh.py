"""A run's process state (`distnb.rank.fresh`), in this very process: what a run changes does
not reach the next run nor the cells, and what cells changed since the join does not reach a
run. Real modules, real logging, warnings, signals, torch switches and generators."""

from __future__ import annotations

import atexit
import builtins
import gc
import logging
import os
import signal
import sys
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from distnb.rank import fresh


@pytest.fixture
def joined(tmp_path: Path) -> Iterator[Path]:
    """The process as a rank has it at the join (a package folder on the path, not imported
    yet); `as_fresh` blocks play runs, the test's own code the cells."""
    (tmp_path / "statelib").mkdir()
    (tmp_path / "statelib" / "__init__.py").write_text("STATE: list[str] = []\n")
    sys.path.insert(0, str(tmp_path))
    fresh.remember()
    yield tmp_path
    fresh.forget()
    sys.path.remove(str(tmp_path))
    sys.modules.pop("statelib", None)


def test_a_library_imported_in_a_run_starts_empty_in_the_next(joined: Path) -> None:
    import statelib  # the cells' copy

    statelib.STATE.append("cells")
    seen = []
    for run in ("first", "second"):
        with fresh.as_fresh():
            import statelib as theirs

            seen.append(list(theirs.STATE))
            theirs.STATE.append(run)
            assert theirs is not statelib
    assert seen == [[], []]  # each run imported it afresh
    assert sys.modules["statelib"] is statelib and statelib.STATE == ["cells"]


def test_the_standard_library_torch_and_compiled_packages_stay_loaded(joined: Path) -> None:
    candidates = [n for n in ("yaml", "regex", "markupsafe") if n not in sys.modules]
    with fresh.as_fresh():
        import xml.dom.minidom  # noqa: F401 - standard library

        import torch.distributed.fsdp  # noqa: F401 - torch's, imported since the join

        for name in candidates:
            __import__(name)
        loaded = {n: sys.modules[n] for n in ("xml.dom.minidom", "torch.distributed.fsdp")}
        loaded.update({n: sys.modules[n] for n in candidates})
    with fresh.as_fresh():
        for name, module in loaded.items():
            assert sys.modules.get(name) is module, f"{name} was imported again"


def test_environment_logging_warnings_and_builtins_are_the_joins(joined: Path) -> None:
    os.environ["DISTNB_CELL_VAR"] = "cells"  # set by a cell after the join
    logging.getLogger("distnb.test.fresh").setLevel(logging.ERROR)
    root_handlers = list(logging.root.handlers)
    try:
        with fresh.as_fresh():
            assert "DISTNB_CELL_VAR" not in os.environ
            assert logging.getLogger("distnb.test.fresh").level == logging.NOTSET
            os.environ["DISTNB_RUN_VAR"] = "run"
            logging.basicConfig(level=logging.DEBUG, force=True)
            warnings.simplefilter("error")
            builtins.distnb_test_name = 1  # type: ignore[attr-defined]
        assert os.environ["DISTNB_CELL_VAR"] == "cells" and "DISTNB_RUN_VAR" not in os.environ
        assert logging.root.handlers == root_handlers
        assert logging.getLogger("distnb.test.fresh").level == logging.ERROR
        assert not hasattr(builtins, "distnb_test_name")
        with warnings.catch_warnings(record=True):
            warnings.warn("not an error", UserWarning, stacklevel=1)  # filters back
    finally:
        del os.environ["DISTNB_CELL_VAR"]
        logging.getLogger("distnb.test.fresh").setLevel(logging.NOTSET)


def test_a_warning_shown_once_in_a_run_shows_again_in_the_next(joined: Path) -> None:
    shown = []
    for _ in range(2):
        with fresh.as_fresh(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("once")
            warnings.warn("deprecated thing", FutureWarning, stacklevel=1)
            shown.append(len(caught))
    assert shown == [1, 1]


def test_signal_handlers_but_sigint_are_the_joins(joined: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    saved = signal.getsignal(signal.SIGUSR1)
    try:
        with fresh.as_fresh():
            signal.signal(signal.SIGUSR1, mine)
            sigint = signal.getsignal(signal.SIGINT)
        assert signal.getsignal(signal.SIGUSR1) is saved
        assert sigint is signal.getsignal(signal.SIGINT)  # Ctrl-C stays the cell's
    finally:
        signal.signal(signal.SIGUSR1, saved)


def test_torch_switches_are_the_joins_during_and_the_cells_after(joined: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_printoptions(precision=2)  # a cell's choice, since the join
    try:
        for _ in range(2):
            with fresh.as_fresh():
                assert torch.get_default_dtype() == torch.float32
                assert torch.is_grad_enabled() and not torch.is_anomaly_enabled()
                assert not torch.are_deterministic_algorithms_enabled()
                assert str(torch.tensor([1 / 3])) == "tensor([0.3333])"
                torch.set_default_dtype(torch.float64)
                torch.set_num_threads(threads + 1)
                torch.use_deterministic_algorithms(True)
                torch.set_grad_enabled(False)
                torch.autograd.set_detect_anomaly(True)
                torch.set_float32_matmul_precision("medium")
        assert str(torch.tensor([1 / 3])) == "tensor([0.33])"
    finally:
        torch.set_printoptions(profile="default")
    assert torch.get_default_dtype() == torch.float32 and torch.get_num_threads() == threads
    assert not torch.are_deterministic_algorithms_enabled() and torch.is_grad_enabled()
    assert not torch.is_anomaly_enabled()
    assert torch.get_float32_matmul_precision() == "highest"


def test_torch_config_modules_are_the_joins_during_and_the_cells_after(tmp_path: Path) -> None:
    import torch._dynamo.config as config  # loaded at the join, as a rank may have it

    default = config.cache_size_limit
    fresh.remember()
    try:
        config.cache_size_limit = default + 3  # a cell's choice, since the join
        for _ in range(2):
            with fresh.as_fresh():
                assert config.cache_size_limit == default
                config.cache_size_limit = default + 90
        assert config.cache_size_limit == default + 3
    finally:
        fresh.forget()
        config.cache_size_limit = default


def tf32_state() -> list[object]:
    """Every TF32 setting, old API and new; "unreadable" where torch refuses to read one."""
    backends = torch.backends
    getters = [
        lambda: backends.cuda.matmul.allow_tf32,
        lambda: backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision,
        *(
            (lambda o=o: o.fp32_precision)
            for o in (backends, backends.cuda.matmul, backends.cudnn, backends.mkldnn)
        ),
    ]
    state: list[object] = []
    for get in getters:
        try:
            state.append(get())
        except RuntimeError:
            state.append("unreadable")
    return state


@pytest.mark.parametrize(
    "change",
    [
        "torch.backends.cuda.matmul.allow_tf32 = True",
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'",
        "torch.set_float32_matmul_precision('medium')",
        "torch.backends.fp32_precision = 'tf32'",
        "torch.backends.cudnn.allow_tf32 = False",
        "torch.backends.cudnn.fp32_precision = 'tf32'",
        "torch.backends.mkldnn.fp32_precision = 'bf16'",
    ],
)
def test_tf32_either_api_is_set_back_readable(joined: Path, change: str) -> None:
    """torch 2.13's two TF32 APIs write each other, and an old flag read after the new API was
    used raises: whichever a run used, the next run and the cells find TF32 as it was."""
    before = tf32_state()
    assert "unreadable" not in before
    with fresh.as_fresh(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the old API's deprecation
        exec(change)
        assert tf32_state() != before
    assert tf32_state() == before


def test_runs_get_new_seeds_and_the_cells_sequence_goes_on(joined: Path) -> None:
    import random

    torch.manual_seed(7)
    random.seed(7)
    expected = torch.rand(3), random.random()
    torch.manual_seed(7)
    random.seed(7)
    draws = []
    for _ in range(2):
        with fresh.as_fresh():
            draws.append((torch.initial_seed(), torch.rand(3), random.random()))
    assert draws[0][0] != draws[1][0] and not torch.equal(draws[0][1], draws[1][1])
    assert draws[0][2] != draws[1][2]
    after = torch.rand(3), random.random()
    assert torch.equal(after[0], expected[0]) and after[1] == expected[1]


EXITLIB = """
import atexit, os, typing

class Thing:
    pass

MAYBE = typing.Optional[Thing]  # typing caches the alias, and Thing with it

@typing.overload
def f(x: int) -> int: ...
@typing.overload
def f(x: str) -> str: ...
def f(x):
    return x

def bye():
    with open(LOG, "a") as log:
        log.write("exitlib\\n")

def forked():
    with open(LOG, "a") as log:
        log.write("forked\\n")

atexit.register(bye)
os.register_at_fork(after_in_child=forked)  # as huggingface_hub does
"""


def test_a_runs_atexit_and_fork_handlers_are_its_own_and_its_modules_are_let_go(
    joined: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = joined / "exits.log"
    (joined / "exitlib.py").write_text(f"LOG = {str(log)!r}\n" + EXITLIB)

    def the_scripts() -> None:
        with open(log, "a") as out:
            out.write("script\n")

    def failing() -> None:
        raise ValueError("a handler that fails")

    def the_process() -> None:
        with open(log, "a") as out:
            out.write("kept\n")

    forks_on = [True]  # the kept module's fork handler stays the process's: off after the test

    def the_process_forked() -> None:
        if forks_on[0]:
            with open(log, "a") as out:
                out.write("kept forked\n")

    def registers(module: str, *handler: object) -> None:
        """`atexit.register(*handler)` as the module `module` calls it."""
        names = {"__name__": module, "atexit": atexit, "handler": handler}
        exec("atexit.register(*handler)", names)

    with fresh.as_fresh():
        import exitlib

        thing = weakref.ref(exitlib.Thing)
        del exitlib
        registers("__main__", the_scripts)  # the script's
        registers("__main__", failing)
        registers("__main__", print, "done")  # a builtin, the script's all the same
        registers("json", the_process)  # a module the process keeps
        exec(  # as that module calls it
            "os.register_at_fork(after_in_child=handler)",
            {"__name__": "json", "os": os, "handler": the_process_forked},
        )
        assert not log.exists()
        _fork_and_wait()  # the run's fork handlers are called in the child
        assert log.read_text().splitlines() == ["forked", "kept forked"]
        log.unlink()
    try:
        assert log.read_text().splitlines() == ["script", "exitlib"]  # the last first
        said = capsys.readouterr()
        assert "Exception ignored in atexit callback" in said.err and said.out == "done\n"
        gc.collect()
        assert thing() is None  # neither typing nor atexit holds the run's module
        with fresh.as_fresh():
            pass  # the handlers ran once: they were unregistered
        _fork_and_wait()  # the run's fork handler was the run's only; the kept one stays
        assert log.read_text().splitlines() == ["script", "exitlib", "kept forked"]
    finally:
        atexit.unregister(the_process)  # left for the process's exit
        forks_on[0] = False


def _fork_and_wait() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # the fork handlers have run
    assert os.waitpid(pid, 0)[1] == 0


PATCHLIB = """\
import functools, logging, torch

def capture(compile_fn):  # as Lightning wraps torch.compile
    @functools.wraps(compile_fn)
    def wrapper(*args, **kwargs):
        return compile_fn(*args, **kwargs)
    return wrapper

torch.compile = capture(torch.compile)

def warning_once(self, *args):  # as transformers adds to logging.Logger
    pass

logging.Logger.warning_once = warning_once
"""


def test_what_a_library_patches_into_torch_and_logging_is_each_runs_own(joined: Path) -> None:
    (joined / "patchlib.py").write_text(PATCHLIB)
    torchs = torch.compile
    loggers = getattr(logging.Logger, "warning_once", None)  # the join's (transformers' if loaded)
    kept = "def made(): pass\nimport torch\ntorch._kept_patch = made"  # made by what stays
    try:
        import patchlib  # the cells' patches

        cells = (torch.compile, logging.Logger.warning_once)  # type: ignore[attr-defined]
        runs = []
        for _ in range(3):
            with fresh.as_fresh():
                assert torch.compile is torchs  # not the cells' wrapper
                assert getattr(logging.Logger, "warning_once", None) is loggers
                import patchlib as theirs

                assert theirs is not patchlib
                assert torch.compile.__wrapped__ is torchs  # type: ignore[attr-defined]
                runs.append(weakref.ref(theirs))
                del theirs
                exec("import torch\ntorch._runs_patch = lambda: 0", {"__name__": "__main__"})
                exec(kept, {"__name__": "json"})
        with fresh.as_fresh():  # a run that patches nothing leaves the cells' patches theirs
            assert torch.compile is torchs
        assert (torch.compile, logging.Logger.warning_once) == cells  # type: ignore[attr-defined]
        assert not hasattr(torch, "_runs_patch")
        assert torch._kept_patch.__globals__["__name__"] == "json"  # type: ignore[attr-defined]
        gc.collect()
        assert [run() for run in runs] == [None] * 3  # no wrapper holds a run's module
    finally:
        torch.compile = torchs
        if loggers is None:
            del logging.Logger.warning_once  # type: ignore[attr-defined]
        else:
            logging.Logger.warning_once = loggers  # type: ignore[attr-defined]
        del torch._kept_patch  # type: ignore[attr-defined]
        sys.modules.pop("patchlib", None)


def test_a_run_set_aside_part_way_is_where_a_later_run_starts(joined: Path) -> None:
    (joined / "patchlib.py").write_text(PATCHLIB)
    log = joined / "exits.log"
    (joined / "exitlib.py").write_text(EXITLIB.replace("LOG", repr(str(log))))
    torchs = torch.compile
    try:
        made, modules = [], []
        for _ in range(2):
            with fresh.as_fresh():
                before = fresh.unchanged()
                import exitlib
                import patchlib

                os.environ["SET_AHEAD"] = "1"
                made.append(fresh.set_aside(before))
                modules.append((patchlib, exitlib))
            # the cells see none of it, and no handler of the run's ran at its end
            assert "patchlib" not in sys.modules and "exitlib" not in sys.modules
            assert torch.compile is torchs and "SET_AHEAD" not in os.environ
            assert not log.exists()
        first, second = made
        assert first is not None and second is not None
        with fresh.as_fresh(first):  # goes on from where the first left
            import patchlib as again

            assert (again, sys.modules["exitlib"]) == modules[0]
            assert torch.compile.__wrapped__ is torchs  # type: ignore[attr-defined]
            assert os.environ["SET_AHEAD"] == "1"
        assert torch.compile is torchs and "SET_AHEAD" not in os.environ
        assert log.read_text() == "exitlib\n"  # its handler ran as the run ended
        fresh.end_aside(second)  # no run starts from it: its handlers run, as at its end
        assert log.read_text() == "exitlib\nexitlib\n"
        with fresh.as_fresh():  # code that changes what a run cannot carry is not set aside
            before = fresh.unchanged()
            builtins.AHEAD = 1  # type: ignore[attr-defined]
            try:
                assert fresh.set_aside(before) is None
            finally:
                del builtins.AHEAD  # type: ignore[attr-defined]
    finally:
        torch.compile = torchs
        for name in ("patchlib", "exitlib"):
            sys.modules.pop(name, None)


def test_outside_a_rank_nothing_is_reset() -> None:
    os.environ["DISTNB_OUTSIDE"] = "1"
    try:
        with fresh.as_fresh():  # nothing remembered: plain Python, a test
            assert os.environ["DISTNB_OUTSIDE"] == "1"
    finally:
        del os.environ["DISTNB_OUTSIDE"]


class Interrupted:
    """A part whose put-back a real SIGINT interrupts: the kernel's Ctrl-C as a run ends."""

    name = "interrupted"

    def capture(self) -> None:
        return None

    def fresh(self, joined: None) -> None:
        pass

    def restore(self, saved: None) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_as_a_run_ends_waits_until_the_cells_state_is_whole(
    joined: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statelib  # the cells' copy

    from distnb.rank.fresh import reset

    # put back first (parts are put back last first): the others come after the signal
    monkeypatch.setattr(reset, "PARTS", (*reset.PARTS, Interrupted()))
    with pytest.raises(KeyboardInterrupt), fresh.as_fresh():
        import statelib as theirs

        assert theirs is not statelib
    assert sys.modules["statelib"] is statelib  # the modules were put back all the same
    assert not fresh.running()
