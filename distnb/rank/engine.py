"""Engine entry point: `python -m distnb.rank.engine [ipengine arguments]`.

It imports torch before ipyparallel's engine starts, so the import (the slowest part of a rank's
start) runs while the controller is still coming up instead of after registration. It also
makes a rank's death legible and quick to report:

- **stderr is not captured at the file-descriptor level.** ipykernel would point fd 2 at a pipe
  that a thread of the same process reads; a process that aborts takes that thread with it, and
  gloo's or NCCL's last words (`terminate called after throwing an instance of
  'gloo::EnforceNotMet'`) were lost. fd 2 stays the engine's log file, and Python-level output
  (cells' `print`s) is echoed there too, line by line, so the kernel can show what a rank said
  last in the cell it died in. fd 1 is still captured, so C-level prints reach the cell.
- **faulthandler** writes the Python stack of every thread to the log on SIGABRT/SIGSEGV, which
  names the cell line a rank died at.
- **no core dumps**: a core of a process with torch loaded takes seconds to write, and the rank
  is not reported dead until it is written.
- **SIGTERM ends the rank at once.** ipyparallel's engine would finish the running cell first
  (forever, for a rank waiting at a collective), and its death would go unreported meanwhile.
- **patience with the controller.** An engine is ready within a second of its launch (a forked
  one) and often before a loaded machine's controller has written its connection file or can
  answer a registration; ipyparallel's engine gives up after 10 s and 5 s. The kernel's own wait
  for the ranks' registration (`Cluster.wait_registered`) judges a start, with its report.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import signal
from typing import Any, ClassVar

import torch
import torch.distributed
from ipykernel.iostream import OutStream
from ipyparallel.engine.app import IPEngine
from traitlets import default

__all__ = ["Engine", "EngineStream", "main", "torch"]


class EngineStream(OutStream):
    """ipykernel's stream for `sys.stdout`/`sys.stderr`, echoing every line to the log file.

    `written` counts the characters written so far: a rank that asks the user for input says
    how many it had written, so the kernel shows them all before the prompt.

    The two streams go out in the order written: ipykernel buffers each for up to 0.2 s and
    sends them apart, so `a` to stdout, `b` to stderr, `c` to stdout arrived as `ac`, then `b`.
    A write to one stream first sends what the other holds (a flush waits on ipykernel's I/O
    thread, which sends messages one after another), which costs only when a cell switches
    streams. A write that Ctrl-C cuts short still gets its flush.
    """

    written = 0
    _pair: ClassVar[dict[str, EngineStream]] = {}  # the process's two streams, by name

    def __init__(self, session: Any, pub_thread: Any, name: str, **kwargs: Any) -> None:
        fd = 1 if name == "stdout" else 2
        # A copy of the fd as it is now (the log file), line-buffered: a line is in the file
        # once it is printed, before any crash.
        echo = open(os.dup(fd), "w", buffering=1, errors="replace")  # noqa: SIM115
        # "force": ipykernel skips fd capture when it sees pytest's variable, which engines
        # started from a test inherit; they must behave as they do for users.
        watch: bool | str = "force" if name == "stdout" else False
        super().__init__(  # type: ignore[no-untyped-call]
            session, pub_thread, name, echo=echo, watchfd=watch, **kwargs
        )
        EngineStream._pair[name] = self

    def write(self, string: str) -> int:
        other = self._pair.get("stderr" if self.name == "stdout" else "stdout")
        if other is not None and other._flush_pending:
            other.flush()  # type: ignore[no-untyped-call]
        try:
            n = super().write(string)
        except KeyboardInterrupt:
            # Ctrl-C between ipykernel marking a flush pending and scheduling it (its
            # `_schedule_flush`) leaves every later write of this process in the buffer,
            # unsent: the next cells printed nothing. One more flush sends nothing twice.
            if self._flush_pending:
                self.pub_thread.schedule(self._flush_soon)
            raise
        self.written += len(string)
        return n or 0

    def _flush_soon(self) -> None:  # on ipykernel's I/O thread, as its own schedule does
        self._io_loop.call_later(self.flush_interval, self._flush)


class Engine(IPEngine):  # type: ignore[misc]
    """ipyparallel's engine with the stream and signal handling described above."""

    @default("wait_for_url_file")
    def _wait_for_url_file_default(self) -> float:
        return 300.0

    @default("timeout")
    def _timeout_default(self) -> float:
        return 60.0  # for the controller's answer to the registration

    def init_engine(self) -> None:
        self.out_stream_factory = EngineStream
        super().init_engine()

    def init_signal(self) -> None:
        super().init_signal()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main() -> None:
    _ = torch.distributed.is_available()
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    faulthandler.enable(file=2, all_threads=True)  # fd 2: the log file, before any redirection
    Engine.launch_instance()


if __name__ == "__main__":
    main()
