"""A rank's life as the kernel drives it: the functions the kernel calls on the engines.

The kernel calls these functions on the engines through ipyparallel's `apply`:
`probe()` before ranks are assigned, `init(spec)` to join the process group and fill the
namespace, `shutdown()` before the engines stop; between cells it asks for what a rank holds
(`scan`, `overflow_*`, `events`, `clock_ns`). `init` binds the engine's IPython
shell (`distnb.rank.shell`: the rank's names, the kernel's cell numbers, the hooks around each
cell) and starts the threads that answer the kernel's requests for the rank's live stack
(`distnb.rank.stacks`), post again what a stranger overwrote (`distnb.contract.posts`) and end the
rank once its kernel is gone (`distnb.rank.lifeline`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from distnb.contract import keys, posts
from distnb.contract.signed import SignedStore
from distnb.errors import SessionError
from distnb.rank import checked, fresh, shell
from distnb.rank.lifeline import Lifeline
from distnb.rank.stacks import StackServer
from distnb.rank.torchrun import device_plan, environment, route_to
from distnb.rank.world import World
from distnb.records.cell import LAUNCHED_ON_VAR, EngineProbe, RankInfo, RankSpec
from distnb.records.collective import CollectiveEvent
from distnb.records.overflow import RankOverflowReport
from distnb.records.shapes import ShapeScan

# Environment variables `init` set, with the values they had before (None: unset).
_saved_env: dict[str, str | None] = {}


@dataclass
class _Runtime:
    spec: RankSpec
    store: dist.Store
    device: torch.device
    stacks: StackServer
    world: World
    lifeline: Lifeline
    reposter: posts.Reposter | None  # off loopback only: there values can be forged
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
    # First: a rank whose kernel goes away while it joins (or in any cell after) ends itself.
    lifeline = Lifeline(spec.rank, (spec.store_host, spec.store_port), leftover=_profile_folder())
    lifeline.start()
    store = connect(spec)
    reposter = posts.Reposter(spec.rank, partial(connect, spec)) if spec.secret else None
    if reposter is not None:
        reposter.start()
    device = _device_for(spec)
    _set_environment(spec, device)
    address = _post_endpoint(spec, store)
    world = World(spec, store, device)
    world.create()
    stacks = StackServer(spec.rank, partial(connect, spec))
    _runtime = _Runtime(spec, store, device, stacks, world, lifeline, reposter)
    if spec.check:
        _install_checks(spec, store)
    world.hook()
    shell.bind(spec, device, world)
    stacks.start()
    fresh.remember()  # what each %dist_run starts from, as a new torchrun worker would
    return RankInfo(
        rank=spec.rank,
        local_rank=spec.local_rank,
        engine_id=-1,
        host=socket.gethostname(),
        pid=os.getpid(),
        device=str(device),
        backend=spec.backend,
        address=address,
        launched_on=os.environ.get(LAUNCHED_ON_VAR, ""),
    )


def _profile_folder() -> str:
    """The session's own profile folder the engine runs in (its launcher's copy, on another
    host), or "" (no engine, or a profile that is not a session's)."""
    from IPython import get_ipython

    shell = get_ipython()
    location = str(shell.config.get("ProfileDir", {}).get("location", "")) if shell else ""
    return location if os.path.basename(location).startswith("distnb-profile-") else ""


def _post_endpoint(spec: RankSpec, store: dist.Store) -> str:
    """Where this rank listens (its address), for the kernel to name if the group cannot
    connect."""
    route = route_to(spec.store_host)
    address = route[1] if route else ""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    where = {"host": socket.gethostname(), "ifname": ifname, "address": address}
    posts.post(store, keys.endpoint(spec.rank), json.dumps(where))
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
    from distnb.rank.scan import scan_namespace

    ns = shell.namespace()
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
    from distnb.rank.scan import resolve

    missing = "this rank has no {name!r}; define it in an %%allranks cell first"
    return resolve(shell.namespace(), path, missing)


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
    """Leave the process group and stop the stack server; the engine stays usable."""
    global _runtime
    if _runtime is None:
        return
    fresh.forget()
    shell.unbind()
    World.unhook()
    _uninstall_checks()
    _runtime.stacks.stop(_runtime.store)
    if _runtime.reposter is not None:
        _runtime.reposter.stop(_runtime.store)
    _runtime.lifeline.stop()
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


def connect_adapter(channel: str) -> None:
    """On a rank: connect its debug adapter to the kernel through the control plane, on
    `channel` (the kernel's end is already relaying)."""
    from distnb.contract.relay import Relay
    from distnb.rank.debug.visual import listen

    host, port, _ = listen()
    sock = socket.create_connection((host, port), timeout=10)
    sock.settimeout(None)
    Relay(sock, channel, "kernel", (control_client(), control_client()))
