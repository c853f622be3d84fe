"""Shared fixtures: one real 2-rank gloo session for the whole test run.

Tests that break a cluster on purpose (killing a rank, restarting) start their own session.

The run keeps to private folders: IPython's (history, profiles, security files), Jupyter's
(config, data, runtime: connection files), matplotlib's and torch.compile's caches are set here,
before anything starts a shell, so every kernel, engine and shell the tests start inherits them
and the user's own `~/.ipython`, `~/.jupyter`, `~/.local/share/jupyter` and
`/tmp/torchinductor_<user>` stay as they were
(tests/test_private_dirs.py checks it).

The check tier (`make check`: `pytest -m check`, a few minutes, for every commit) is every test
without a tier marker (the markers pyproject.toml registers: cluster, gloo, notebook, ...) and a
handful of cluster tests marked `check`. Those share the session above; besides it, only the
dead rank's test starts a cluster. Two guards keep the tier fast: a `check` test of any tier but
cluster is refused at collection, and a run whose `check` tests start more than `CHECK_STARTS`
clusters fails, naming the tests that started them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli where tomllib is missing
    import tomli as tomllib

# Module level, not a fixture: pytest imports this file before it collects any test module, so
# no IPython shell or kernel can exist yet. Variables a user set are replaced too: the run must
# neither write to their folders nor read their startup files, configs and kernelspecs.
# A process a test spawns (`mp.spawn` imports the test's module, and with it this file) keeps
# the run's folders: a folder of its own would outlive the run, since only the run removes its.
_INHERITED = os.environ.get("DISTNB_TESTS_DIRS", "")
PRIVATE_DIRS = Path(_INHERITED or tempfile.mkdtemp(prefix="distnb-tests-"))
os.environ["DISTNB_TESTS_DIRS"] = str(PRIVATE_DIRS)
PRIVATE_ENV = {
    "IPYTHONDIR": str(PRIVATE_DIRS / "ipython"),
    "JUPYTER_CONFIG_DIR": str(PRIVATE_DIRS / "jupyter-config"),
    "JUPYTER_DATA_DIR": str(PRIVATE_DIRS / "jupyter-data"),
    "JUPYTER_RUNTIME_DIR": str(PRIVATE_DIRS / "jupyter-runtime"),
    "MPLCONFIGDIR": str(PRIVATE_DIRS / "matplotlib"),
    # torch.compile's caches: graphs compiled by another run (another checkout) stay out
    "TORCHINDUCTOR_CACHE_DIR": str(PRIVATE_DIRS / "torchinductor"),
    "TRITON_CACHE_DIR": str(PRIVATE_DIRS / "triton"),
    # torch keeps precompiled headers in `<tmp>/torchinductor_<user>` whatever the cache folder
    # above says: the run precompiles none (a speed-up of the C++ compile only)
    "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
}
os.environ.update(PRIVATE_ENV)
# A Slurm allocation the run happens to be inside (tests run in a job, or from salloc's shell)
# must not change what a start does; tests/multihost makes allocations of its own.
for _name in [k for k in os.environ if k.startswith("SLURM") and k != "SLURM_CONF"]:
    del os.environ[_name]
# A run started in the background of a non-interactive shell (`make test &` in a script) ignores
# SIGINT, and so would every process it starts: the tests of Ctrl-C would wait for nothing.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _INHERITED:
        shutil.rmtree(PRIVATE_DIRS, ignore_errors=True)


# The check tier's clusters: the shared session, and the dead rank's own (a session with a dead
# rank needs a restart, which costs as much as a cluster of its own and would not be shared).
CHECK_STARTS = 2
_started_by: list[str] = []  # the node id of the test running at each `Session.start`
_counting = False


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m check` sees the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    assert config.inipath is not None
    ini = tomllib.loads(config.inipath.read_text())["tool"]["pytest"]["ini_options"]
    tiers = {re.split(r"[:(]", line)[0] for line in ini["markers"]} - {"check"}
    refused = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        if not marks & tiers:
            item.add_marker(pytest.mark.check)
        elif "check" in marks and marks & tiers != {"cluster"}:
            refused.append(f"{item.nodeid} ({', '.join(sorted(marks & tiers))})")
    if refused:
        raise pytest.UsageError(
            "the check tier takes tests without a tier marker and cluster tests that share the "
            "session fixture; remove `check` from: " + "; ".join(refused)
        )


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start a session
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _counting
    if _counting or item.get_closest_marker("check") is None:
        return
    from distnb.session import Session

    start = Session.start
    _counting = True

    def counted_start(self: Session) -> Session:
        test = os.environ.get("PYTEST_CURRENT_TEST", "")  # "NODEID (setup)"
        _started_by.append(test.rsplit(" ", 1)[0])
        return start(self)

    Session.start = counted_start  # type: ignore[method-assign]


def pytest_sessionfinish(session: pytest.Session) -> None:
    items = getattr(session, "items", [])  # none where collection failed
    checked = {item.nodeid for item in items if item.get_closest_marker("check")}
    starts = [test for test in _started_by if test in checked]
    if len(starts) > CHECK_STARTS:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        names = ", ".join(sorted(set(starts)))
        session.config.get_terminal_writer().line(
            f"\nthe check tier started {len(starts)} clusters, more than CHECK_STARTS = "
            f"{CHECK_STARTS} (tests/conftest.py): {names}. Let them share the `session` "
            "fixture, or take `check` off them.",
            red=True,
        )


if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session


@pytest.fixture(scope="session")
def session() -> Iterator[Session]:
    import distnb

    s = distnb.start(2, progress=False)
    yield s
    s.stop()


@pytest.fixture
def shell(session: Session) -> Iterator[InteractiveShell]:
    """A real IPython shell with distnb loaded and bound to the shared session."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    from distnb.magics import DistMagics

    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "distnb")
    magics = next(m for m in ip.magics_manager.registry.values() if isinstance(m, DistMagics))
    magics.session = session
    yield ip
    magics.session = None
