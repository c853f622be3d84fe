"""One session in a process of its own, running cells when told: a side of `bench_output.py`,
which compares two versions of distnb's cell path in the same run.

    python bench/cell_worker.py FD      (distnb imported from PYTHONPATH)

Reads one cell kind per line on stdin, runs it with `session.run` and writes its time (s) to
file descriptor FD; the first line written is the distnb it imported. Its stdout should be a
terminal, as in terminal IPython, where ranks' lines are printed as they come.
"""

from __future__ import annotations

import os
import sys
import time

CELLS = {
    "empty": "",
    "quiet": "x = sum(range(1000))",  # works, prints nothing
    "prints": "print('step', 1)",  # one identical line from each rank
}


def main() -> None:
    import distnb

    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    session = distnb.start(2, progress=False)
    out.write(f"{os.path.dirname(distnb.__file__)}\n")
    try:
        for line in sys.stdin:
            code = CELLS[line.strip()]
            started = time.perf_counter()
            session.run(code)
            out.write(f"{time.perf_counter() - started}\n")
    finally:
        session.stop()


if __name__ == "__main__":
    main()
