"""Each third-party script's verdict under torchrun, derived again and compared with the table
the tests hold (`harness/thirdparty.py`, `VERDICTS`).

    python bench/torchrun_verdicts.py [--timeout 240] [NAME ...]

Runs every script (or the NAMEs given) under `torchrun --standalone --nproc-per-node 2`, one at
a time, with the environment distnb gives CPU ranks, and prints its verdict (pass, each rank's
exception, or "hangs" past the timeout) with the table's. Exits 1 where one differs. A script
that hangs costs the whole timeout: 240 s by default.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.thirdparty import ACCELERATE, VERDICTS, script_path, torchrun_verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("names", nargs="*", default=list(VERDICTS))
    args = parser.parse_args()
    installed = importlib.metadata.version("accelerate")
    print(f"Accelerate {installed}; the table's: {ACCELERATE}")
    differ = 0
    for name in args.names:
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as logs:
            verdict = torchrun_verdict(script_path(name), Path(logs), args.timeout)
        took = time.monotonic() - started
        recorded = VERDICTS.get(name)
        same = recorded is not None and recorded.allows(verdict)
        differ += not same
        print(f"{name}: {verdict} ({took:.1f} s)" + ("" if same else f"; recorded: {recorded}"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
