"""A job's run folder: where `python -m distnb.run` says how to reach the job's agents.

`~/.distnb/runs/<run id>/` (the base folder is `$DISTNB_RUNS` where set) holds

- `endpoint.json`: the address and port of the job's control plane (a TCPStore the launcher
  hosts), the run id (the store's prefix), the launcher's host and pid, when it started and its
  command line;
- `secret`: the key every value in that store is signed with (`distnb.contract.signed`), readable by
  the user alone (mode 0600, in a 0700 folder): whoever can read it can attach, nobody else;
- `ended` once the launcher has returned (its exit status);
- `ends/<rank>.json`: each rank's last snapshot, written by its agent as its process ends (how:
  its script finished, or raised what, where; the collective it was in, the last it finished),
  so that the verdict on a job that ended, or a rank that ended while its peers wait, can say
  what each rank did last. A rank killed (SIGKILL, out of memory) writes none.

A launcher that makes a run folder prunes those of ended runs, keeping the newest `KEEP_ENDED`
(a notebook may still read what one said); folders of runs that have not ended are never touched.

The run id is the Slurm job's (`slurm-<job id>`) inside a Slurm job, the name given with
`--distnb-run`, or the start time and the launcher's pid. Pure: no torch, so the notebook reads
it cheaply.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from distnb.errors import ConfigError
from distnb.records.codec import Record

__all__ = ["KEEP_ENDED", "RUNS_VAR", "Endpoint", "RunFolder", "base", "prune", "run_id"]

RUNS_VAR = "DISTNB_RUNS"
KEEP_ENDED = 10  # ended runs' folders kept, the newest


@dataclass(frozen=True, slots=True)
class Endpoint(Record):
    """How to reach a job's control plane (`endpoint.json`)."""

    run: str
    host: str
    port: int
    hostname: str
    launcher_pid: int
    started: float
    argv: tuple[str, ...] = ()


def base() -> Path:
    """Where run folders live: `$DISTNB_RUNS`, else `~/.distnb/runs`."""
    return Path(os.environ.get(RUNS_VAR) or Path.home() / ".distnb" / "runs")


def run_id(name: str | None = None) -> str:
    """The run id a launcher uses: `name`, the Slurm job's, or the time and the pid."""
    if name:
        return name
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        node = os.environ.get("SLURM_NODEID", "0")
        return f"slurm-{job}" if node == "0" else f"slurm-{job}-node{node}"
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def prune(root: Path, keep: int = KEEP_ENDED) -> list[Path]:
    """Remove the folders of ended runs under `root` but the newest `keep`; the ones removed.
    A folder another launcher removes meanwhile is no error."""
    ended = sorted(
        (p.parent for p in root.glob("*/ended")),
        key=lambda folder: _mtime(folder / "ended"),
        reverse=True,
    )
    removed = []
    for folder in ended[keep:]:
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


class RunFolder:
    """One run folder (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, run: str) -> RunFolder:
        """A new folder for `run`, readable by the user alone; ConfigError if it exists."""
        root = base()
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        prune(root)
        path = root / run
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            raise ConfigError(
                f"the run folder {path} exists already: name this run otherwise "
                "(--distnb-run NAME) or remove the folder of the run before"
            ) from None
        return cls(path)

    def write_secret(self) -> str:
        secret = secrets.token_hex(32)
        fd = os.open(self.path / "secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret)
        return secret

    def write_endpoint(self, endpoint: Endpoint) -> None:
        tmp = self.path / "endpoint.json.tmp"
        tmp.write_text(json.dumps(endpoint.to_dict()))
        tmp.replace(self.path / "endpoint.json")  # readers never see half a file

    def mark_ended(self, status: int) -> None:
        (self.path / "ended").write_text(str(status))

    def endpoint(self) -> Endpoint:
        try:
            return Endpoint.from_dict(json.loads((self.path / "endpoint.json").read_text()))
        except FileNotFoundError:
            raise ConfigError(
                f"{self.path} is not a run folder of `python -m distnb.run` (no endpoint.json)"
            ) from None

    def secret(self) -> str:
        try:
            return (self.path / "secret").read_text().strip()
        except PermissionError:
            raise ConfigError(
                f"cannot read {self.path / 'secret'}: only the user who started the job can "
                "attach to it"
            ) from None

    def write_final(self, rank: int, snapshot: Record) -> None:
        """Rank `rank`'s last snapshot (see the module), whole or not at all."""
        folder = self.path / "ends"
        folder.mkdir(exist_ok=True)
        tmp = folder / f"{rank}.json.tmp"
        tmp.write_text(json.dumps(snapshot.to_dict()))
        tmp.replace(folder / f"{rank}.json")

    def finals(self) -> dict[int, dict[str, object]]:
        """The last snapshots the ranks' agents wrote, by rank (as dicts: `RankSnapshot`'s)."""
        found = {}
        for path in (self.path / "ends").glob("*.json"):
            try:
                found[int(path.stem)] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        return found

    def ended(self) -> int | None:
        """The launcher's exit status once it has returned, else None."""
        try:
            return int((self.path / "ended").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return None
