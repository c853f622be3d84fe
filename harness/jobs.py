"""Real torchrun jobs for the attach tests: `harness/train.py` under torch's own launcher,
through `python -m distnb.run` (with distnb's agent) or plain `torchrun` (without), gloo on CPU,
in a session of their own so that every process of a job is ended after its test."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from distnb.run import RUN_VAR

TRAIN = Path(__file__).with_name("train.py")
START_S = 120.0  # a job's start on a busy 2-core machine (imports, rendezvous)
# an agent's answer, far above its usual milliseconds: at a load average of 12+ on 2 cores, the
# default 2 s was sometimes missed; an agent held by a stranger never answers at all
ANSWER_S = 30.0


def line_of(marker: str, script: Path = TRAIN) -> int:
    """The line of `script` that holds `marker` (a comment there), for stacks and verdicts."""
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


GRADS, METRICS = line_of("# the gradients"), line_of("# the metrics")
CHECKPOINT = line_of("saving a checkpoint")
# What the verdicts say of train.py's hang (`--hang`: rank 1 leaves the loop to save a
# checkpoint while rank 0 waits at the metrics' all_reduce), wherever the job runs.
LEFT_THE_LOOP = (
    f'rank 1 runs at {TRAIN}:{CHECKPOINT} (time.sleep(3600)  # "saving a checkpoint") '
    f"without calling all_reduce #15 on WORLD, which rank 0 waits at {TRAIN}:{METRICS}"
)
SKIPPED = (
    f"rank 1 skipped all_reduce #7 at {TRAIN}:{METRICS} (rank 0 called it); rank 1's #7 "
    f"was its call at {TRAIN}:{GRADS}"
)


def judged(job: Any, until: Callable[[list[str]], bool], timeout_s: float = START_S) -> list[str]:
    """An attached job's verdicts once `until` holds of them. A wait is judged only once it has
    outlasted the ranks' own recent pace (`distnb.judgement.snapshot.patience_s`), so a verdict
    comes a moment after the ranks settle into the hang, not with the first snapshot."""
    deadline = time.monotonic() + timeout_s
    while not until(found := job.verdicts()):
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    return found


class Job:
    """A running job: its launcher process, run folder and log."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: Path, log: Path) -> None:
        self.proc, self.folder, self.log = proc, folder, log

    def finals(self, timeout_s: float = START_S) -> dict[int, str]:
        """`final <rank> <loss bits>` of each rank, once the job has ended."""
        self.proc.wait(timeout=timeout_s)
        found = re.findall(r"final (\d+) (\S+)", self.log.read_text())
        return {int(r): bits for r, bits in found}

    def agents_up(self) -> None:
        """Once the job's run folder is there and every rank's agent has started."""
        import distnb

        deadline = time.monotonic() + START_S
        while not (self.folder / "endpoint.json").exists():
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)
        distnb.attach(str(self.folder), timeout=START_S).detach()

    def wait_for(self, pattern: str, timeout_s: float = START_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not re.search(pattern, self.log.read_text()):
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no {pattern!r}:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.1)


def in_fresh_kernel(source: str, folder: Path, runs: Path) -> str:
    """The output of `source` run in a fresh interpreter (its own IPython shell, as a kernel's)
    with the run folder `folder` as its argument; it must end well."""
    done = subprocess.run(
        [sys.executable, "-c", source, str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "DISTNB_RUNS": str(runs)},
        timeout=START_S,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return out


@contextmanager
def job(
    tmp: Path,
    mode: str = "ok",
    *,
    agent: bool = True,
    env_opt_in: bool = False,
    n: int = 2,
    script: Path = TRAIN,
    **env: str,
) -> Iterator[Job]:
    """A job of `n` ranks running `script` (`train.py`) in `mode` (see its docstring), ended
    after: through `python -m distnb.run`, or plain torchrun without the agent (`agent=False`)
    or opted in through the environment (`env_opt_in`: the lines `--distnb-env` prints)."""
    runs = tmp / "runs"
    name = f"{mode}-{len(list(tmp.glob('*.log')))}"
    if env_opt_in:  # as a user types it: the lines eval'd by a shell, then torchrun itself
        torchrun = [str(Path(sys.executable).with_name("torchrun"))]
        lines = f'eval "$({shlex.quote(sys.executable)} -m distnb.run --distnb-env)"'
        env = {RUN_VAR: name, **env}
    elif agent:
        torchrun = [sys.executable, "-m", "distnb.run", "--distnb-run", name]
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
    argv = [*torchrun, "--standalone", f"--nproc-per-node={n}", str(script)]
    if env_opt_in:
        argv = ["bash", "-c", f"{lines} && exec {shlex.join(argv)}"]
    # torchrun keeps each job's log folders (`torchelastic_*`) in the temporary folder and never
    # removes them: this job's temporary folder is `tmp`'s, removed with it
    scratch = tmp / "tmp"
    scratch.mkdir(exist_ok=True)
    environ = {
        **os.environ, "DISTNB_RUNS": str(runs), "MODE": mode, "TMPDIR": str(scratch), **env
    }  # fmt: skip
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ,
                                cwd=tmp, start_new_session=True)  # fmt: skip
    try:
        yield Job(proc, runs / name, log)
    finally:
        end(proc, str(runs))


def end(proc: subprocess.Popen[bytes], mark: str) -> None:
    """End the launcher's session and every worker (torch's launcher starts each worker in a
    session of its own): the processes whose environment holds `mark`, this job's run base."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    needle = f"DISTNB_RUNS={mark}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
    proc.wait(timeout=30)
