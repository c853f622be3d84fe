"""The part of distnb that lives in each rank process.

The kernel calls these functions on the engines through ipyparallel's `apply`:
`probe()` before ranks are assigned, `init(spec)` to join the process group and fill the
namespace, `shutdown()` before the engines stop. Between cells the engine's IPython runs the
`pre_run_cell` hook below, which picks up the kernel's cell number from the control plane so
that rank tracebacks and call sites say the same `In[N]` as the notebook.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distnb import keys
from distnb.errors import SessionError
from distnb.rank import checked, debug
from distnb.rank.signed import SignedStore
from distnb.rank.torchrun import device_plan, environment, route_to
from distnb.rank.world import World
from distnb.records.cell import EngineProbe, RankInfo, RankSpec
from distnb.records.collective import CollectiveEvent, Mismatch
from distnb.records.overflow import RankOverflowReport
from distnb.records.shapes import ShapeScan

# `unchecked()` blocks opened for a cell run with checks off, closed when it ends.
_cell_unchecked: list[AbstractContextManager[None]] = []

# The engine's IPython shell; None when the runtime is used outside ipyparallel (tests, scripts).
_shell: Any = None

# Environment variables `init` set, with the values they had before (None: unset).
_saved_env: dict[str, str | None] = {}


@dataclass
class _Runtime:
    spec: RankSpec
    store: dist.Store
    device: torch.device
    watchdog: _Watchdog
    world: World
    hooks: list[tuple[str, Any]] = field(default_factory=list)


_runtime: _Runtime | None = None
_LAUNCH_RANKS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")  # mpiexec's, srun's


def probe(engine_id: int) -> EngineProbe:
    """Describe this engine so the kernel can assign ranks (grouped by host, MPI's or srun's
    order kept)."""
    mpi = next(filter(None, map(os.environ.get, _LAUNCH_RANKS)), None)
    return EngineProbe(
        engine_id=engine_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        mpi_rank=int(mpi) if mpi is not None else None,
    )


def init(spec: RankSpec) -> RankInfo:
    """Join the control plane and the process group; give the namespace its names.

    The rank's environment gets what torchrun would set (`distnb.rank.torchrun`), and user
    code's own `init_process_group`/`destroy_process_group` calls are answered by distnb's group
    (`distnb.rank.world`), so code written for torchrun runs unchanged.
    """
    global _runtime
    if _runtime is not None:
        shutdown()
    store = connect(spec)
    device = _device_for(spec)
    _set_environment(spec, device)
    address = _post_endpoint(spec, store)
    world = World(spec, store, device)
    world.create()
    watchdog = _Watchdog(spec)
    _runtime = _Runtime(spec, store, device, watchdog, world)
    if spec.check:
        _install_checks(spec, store)
    world.hook()
    _bind_shell(spec, device)
    watchdog.start()
    return RankInfo(
        rank=spec.rank,
        local_rank=spec.local_rank,
        engine_id=-1,
        host=socket.gethostname(),
        pid=os.getpid(),
        device=str(device),
        backend=spec.backend,
        address=address,
    )


def _post_endpoint(spec: RankSpec, store: dist.Store) -> str:
    """Where this rank listens (its address), for the kernel to name if the group cannot
    connect."""
    route = route_to(spec.store_host)
    address = route[1] if route else ""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    where = {"host": socket.gethostname(), "ifname": ifname, "address": address}
    store.set(keys.endpoint(spec.rank), json.dumps(where))
    return address


def _device_for(spec: RankSpec) -> torch.device:
    visible = torch.cuda.device_count() if spec.backend == "nccl" else 0
    plan = device_plan(
        spec.backend, spec.rank, spec.local_rank, visible, os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    if plan.cuda_index is not None:
        torch.cuda.set_device(plan.cuda_index)  # as torchrun scripts do with LOCAL_RANK
    return torch.device(plan.device)


def _set_environment(spec: RankSpec, device: torch.device) -> None:
    """torchrun's variables for this rank; the values they replace come back at shutdown."""
    env = environment(spec, str(device), os.environ)
    for name, value in env.items():
        _saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = value


def _restore_environment() -> None:
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved_env.clear()


def scan(names: list[str] | None, include_all: bool) -> ShapeScan:
    """This rank's tensors and modules, as metadata (for shape tables)."""
    from distnb.rank.inspect import scan_namespace

    ns = _shell.user_ns if _shell is not None else {}
    rank = _runtime.spec.rank if _runtime is not None else 0
    return scan_namespace(
        ns, names, include_all=include_all, rank=rank, device=str(current_device())
    )


def overflow_watch(name: str, options: dict[str, Any]) -> None:
    """Start the overflow tracer on the module this rank's namespace calls `name`.

    `options`: a `WatchOptions` record, validated in the kernel, as `to_dict()` wrote it.
    """
    from distnb.rank import overflow
    from distnb.records.overflow import WatchOptions

    overflow.attach(name, _lookup(name), WatchOptions.from_dict(options))


def overflow_detach(name: str) -> bool:
    from distnb.rank import overflow

    return overflow.detach(name)


def overflow_reports() -> dict[str, RankOverflowReport]:
    from distnb.rank import overflow

    return {name: w.report() for name, w in overflow.attached().items()}


def _lookup(path: str) -> Any:
    """`model` or `model.encoder` from the rank's namespace, or a NameError saying what is there."""
    ns = _shell.user_ns if _shell is not None else {}
    head, *rest = path.split(".")
    if head not in ns:
        raise NameError(f"this rank has no {head!r}; define it in an %%allranks cell first")
    obj = ns[head]
    for part in rest:
        obj = getattr(obj, part)
    return obj


def last_mismatch() -> Mismatch | None:
    """The collective mismatch this rank raised last, as a record."""
    return checked.last_mismatch()


def events(since_run: int | None) -> list[CollectiveEvent]:
    """This rank's recorded collectives, from run `since_run` on (all when None)."""
    return checked.events(since_run)


def clock_ns() -> int:
    """This rank's monotonic clock, which its collective events are stamped with."""
    return time.monotonic_ns()


def current_device() -> torch.device:
    return _runtime.device if _runtime is not None else torch.device("cpu")


def control_store() -> dist.Store:
    """The control plane's store, for exchanges of distnb's own between ranks."""
    if _runtime is None:
        raise SessionError(
            "this process is not one of distnb's ranks: call this in an %%allranks cell or a "
            "script run with %dist_run"
        )
    return _runtime.store


def control_client() -> dist.Store:
    """A connection of its own to the control plane, for a thread that waits on it."""
    control_store()  # says what to do outside a rank
    assert _runtime is not None
    return connect(_runtime.spec)


def connect(spec: RankSpec) -> dist.Store:
    """A client of the kernel-hosted control plane, under the session's prefix."""
    client = dist.TCPStore(
        spec.store_host, spec.store_port, is_master=False, timeout=timedelta(seconds=30)
    )
    store = dist.PrefixStore(spec.session_id, client)
    return SignedStore(store, bytes.fromhex(spec.secret)) if spec.secret else store


def shutdown() -> None:
    """Leave the process group and stop the watchdog; the engine stays usable."""
    global _runtime
    if _runtime is None:
        return
    _unbind_shell()
    World.unhook()
    _uninstall_checks()
    _runtime.watchdog.stop(_runtime.store)
    _runtime.world.destroy()
    _restore_environment()
    _runtime = None


def _install_checks(spec: RankSpec, store: dist.Store) -> None:
    checked.install(
        store,
        rank=spec.rank,
        world_size=spec.world_size,
        session_id=spec.session_id,
    )


def _uninstall_checks() -> None:
    if checked.installed():
        checked.uninstall()


def _bind_shell(spec: RankSpec, device: torch.device) -> None:
    """Put the rank's names in the engine's namespace and hook its cells."""
    global _shell
    from IPython import get_ipython

    _shell = get_ipython()
    if _shell is None:
        return
    _shell.user_ns.update(
        rank=spec.rank,
        world_size=spec.world_size,
        local_rank=spec.local_rank,
        device=device,
        torch=torch,
        dist=dist,
    )
    if not isinstance(_shell.compile._filename_map, _CellNumbers):
        _shell.compile._filename_map = _CellNumbers(_shell.compile._filename_map)
    _shell.events.register("pre_run_cell", _pre_run_cell)
    _shell.events.register("post_run_cell", _post_run_cell)
    _keep_requests_after_errors(getattr(_shell, "kernel", None))
    assert _runtime is not None
    debug.install(_runtime.store, spec.rank, cell_of_file, _shell)


def _keep_requests_after_errors(kernel: Any) -> None:
    """Make the engine run every cell it is sent, even right after a failed one.

    ipykernel drops the requests queued behind a cell that raised (`stop_on_error`), and goes on
    dropping until a callback of its own runs; the kernel's next cell can arrive in between and
    is lost (ipyparallel reports `TaskAborted`). distnb's cells do not depend on each other, so
    its engines treat every request as `stop_on_error=False`.
    """
    handlers = getattr(kernel, "shell_handlers", None)
    if not handlers or getattr(handlers.get("execute_request"), "_distnb", False):
        return
    original = handlers["execute_request"]

    async def execute_request(stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        parent["content"]["stop_on_error"] = False
        await original(stream, ident, parent)

    execute_request._distnb = True  # type: ignore[attr-defined]
    handlers["execute_request"] = execute_request


def _unbind_shell() -> None:
    debug.uninstall()
    if _shell is not None:
        for event, hook in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
            with suppress(ValueError):
                _shell.events.unregister(event, hook)


def _pre_run_cell(info: Any) -> None:
    """Number this cell as the kernel numbered it, before IPython compiles it."""
    if _runtime is None:
        return
    _runtime.world.restore()  # in case making it again failed at the end of the last cell
    # The session sets RUN before it makes ranks, so this get never waits.
    cell, run_id, check, stdin, everyone = keys.decode_run(_runtime.store.get(keys.RUN))
    # IPython has already taken this cell's number (and counted on by one) when this hook
    # runs; it compiles the cell right after, under the number taken.
    _shell.compile._filename_map.renumber[_shell.execution_count - 1] = cell
    checked.begin_run(run_id, cell_of_file)
    debug.begin_run(run_id, stdin, everyone)
    if not check:  # %%allranks --unchecked: this cell only, on every rank alike
        _cell_unchecked.append(checked.unchecked())
        _cell_unchecked[-1].__enter__()


def _post_run_cell(result: Any) -> None:
    debug.end_run(result.error_in_exec)
    while _cell_unchecked:
        _cell_unchecked.pop().__exit__(None, None, None)
    if _runtime is not None:
        _runtime.world.restore()  # the cell's code destroyed the process group


class _CellNumbers(dict[str, int]):
    """IPython's map of cell filenames to cell numbers (`compile._filename_map`), storing the
    kernel's number instead of the engine's, so that tracebacks say `Cell In[7]` for the
    notebook's cell 7 (the engine counts only the cells it ran)."""

    def __init__(self, existing: dict[str, int]) -> None:
        super().__init__(existing)
        self.renumber: dict[int, int] = {}

    def __setitem__(self, filename: str, number: int) -> None:
        super().__setitem__(filename, self.renumber.pop(number, number))


def cell_of_file(filename: str) -> int | None:
    """The cell number IPython compiled `filename` for, or None for real files."""
    if _shell is None:
        return None
    number = _shell.compile._filename_map.get(filename)
    return int(number) if number is not None else None


def main_stack() -> str:
    """The main thread's Python stack from the cell down, the innermost cell line first."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return "(no main thread)"
    entries = list(traceback.extract_stack(frame))
    cells = [i for i, e in enumerate(entries) if cell_of_file(e.filename) is not None]
    lines = []
    if cells:
        inner = entries[cells[-1]]
        lines.append(
            f"at cell In[{cell_of_file(inner.filename)}] line {inner.lineno}: "
            f"{(inner.line or '').strip()}"
        )
        # Frames below the cell are ipyparallel's and IPython's machinery.
        entries = entries[cells[0] :]
    lines.append("Stack (most recent call last):")
    package = os.path.dirname(os.path.dirname(__file__))
    # distnb's own frames (a checked collective waiting for peers) say nothing to the user.
    entries = [e for e in entries if not e.filename.startswith(package)]
    for entry in entries:
        cell = cell_of_file(entry.filename)
        where = f"In[{cell}]" if cell is not None else entry.filename
        lines.append(f'  File "{where}", line {entry.lineno}, in {entry.name}')
        if entry.line:
            lines.append(f"    {entry.line.strip()}")
    return "\n".join(lines)


class _Watchdog:
    """Answers the kernel's stack requests while the main thread is busy or blocked.

    It has its own store connection: a TCPStore client serialises its calls, and the main
    thread's client may be in use by a collective check when the kernel asks. It blocks in
    `wait` (which releases the GIL) rather than polling, so an idle rank costs nothing.
    """

    STOP = "stop"

    def __init__(self, spec: RankSpec) -> None:
        self._spec = spec
        self._next = 0
        self._thread = threading.Thread(target=self._serve, name="distnb-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, store: dist.Store) -> None:
        store.set(keys.stack_request(self._spec.rank, self._next), self.STOP)
        self._thread.join(timeout=1.0)

    def _serve(self) -> None:
        store = connect(self._spec)
        rank = self._spec.rank
        while True:
            request = keys.stack_request(rank, self._next)
            store.wait([request], timedelta(days=365))
            if store.get(request) == self.STOP.encode():
                return
            store.set(keys.stack_reply(rank, self._next), main_stack())
            self._next += 1
