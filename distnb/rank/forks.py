"""The engines of one machine, forked from one process that imported them once:
`python -m distnb.rank.forks N FOLDER [ipengine arguments]`.

Importing torch, ipykernel and ipyparallel's engine is most of what an engine costs to start
(about 1.4 of its 1.6 s of CPU here) and most of its private memory. This process imports them
(`distnb.rank.engine`) and forks N engines, which share those pages until they write to them;
raw ipyparallel pays the import once per engine. CUDA is never touched here and no thread is
started before the fork, so each engine starts as one started alone would, and picks its device
after the fork as before.

Each engine, a child of this process:

- writes its output to `FOLDER/PID.log` (fds 1 and 2), as an engine started alone writes to
  its launcher's log, so the kernel shows what a rank said last (`members.Members.log_path`);
- runs distnb's engine (`distnb.rank.engine.main`) with the ipengine arguments.

This process is the engines' launcher: it writes each engine's exit status to `FOLDER/PID.exit`
(negative: the signal that ended it; `members.Members.exit_status` reads it), passes SIGTERM
(ipyparallel's stop) on to the engines, and ends once they all have.

Under Slurm (`python -m distnb.rank.forks slurm FOLDER [ipengine arguments]`, as each task of
an srun step) the first task of each node is this process, and each engine it forks takes the
place of one of the node's tasks: `distnb.rank.slurm_tasks`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

__all__ = ["Place", "fork", "main"]


@dataclass(frozen=True, slots=True)
class Place:
    """What a forked engine takes besides the launcher's memory: an environment and the CPUs it
    may run on (None: the launcher's), and what it is called in the launcher's error output."""

    environ: dict[str, str] | None = None
    cpus: frozenset[int] | None = None
    name: str = "engine"


def main(argv: list[str]) -> int:
    count, folder, engine_args = int(argv[0]), argv[1], argv[2:]
    return fork(folder, engine_args, lambda: [Place()] * count)


def fork(
    folder: str,
    engine_args: list[str],
    places: Callable[[], Sequence[Place]],
    say_failures: bool = False,
) -> int:
    """Import the engine, then fork one engine per place (`places` is asked after the import,
    which it may overlap); wait for them all. `say_failures`: an engine that fails has the end
    of its log written to this process's stderr too (where a job's output collects it)."""
    os.makedirs(folder, exist_ok=True)
    from distnb.rank import engine  # torch, ipykernel, ipyparallel's engine: once, for all

    _ = engine.torch.distributed.is_available()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # what was imported stays out of the collector: its pages stay shared
    children: dict[int, Place] = {}
    signal.signal(signal.SIGTERM, lambda *_: _pass_on(set(children), signal.SIGTERM))
    for place in places():
        pid = os.fork()
        if pid == 0:
            _engine(folder, engine_args, engine.main, place)
        children[pid] = place
    failed = 0
    while children:
        pid, status = os.wait()
        place = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        # On another host, a rank whose kernel is gone removes the folder (`lifeline`): the
        # other engines are still this process's to wait for.
        with contextlib.suppress(OSError):
            _write(os.path.join(folder, f"{pid}.exit"), str(code))
        if code and say_failures:
            _say_failure(folder, pid, place, code)
        failed = failed or code
    return 1 if failed else 0


def _engine(folder: str, engine_args: list[str], run: Callable[[], None], place: Place) -> NoReturn:
    """In a forked child: become an engine; never return into the launcher's loop."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if place.environ is not None:
            os.environ.clear()
            os.environ.update(place.environ)
        if place.cpus:
            with contextlib.suppress(OSError):  # not all of them allowed here: the launcher's
                os.sched_setaffinity(0, place.cpus)
        log = os.open(os.path.join(folder, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.argv = ["ipengine", *engine_args]
        run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        os.write(2, traceback.format_exc().encode(errors="replace"))
    os._exit(code)


def _say_failure(folder: str, pid: int, place: Place, code: int) -> None:
    path = os.path.join(folder, f"{pid}.log")
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        tail = "".join(f.readlines()[-15:]).rstrip()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(
            f"{place.name} (pid {pid}) {how}; the end of its log ({path}):\n{tail}",
            file=sys.stderr,
            flush=True,
        )


def _pass_on(children: set[int], sig: int) -> None:
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)


def _write(path: str, text: str) -> None:
    """`text` in `path`, whole or not at all (a reader never sees half of it)."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
