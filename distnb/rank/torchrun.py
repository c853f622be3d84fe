"""What `torchrun` gives each worker, worked out for a distnb rank: pure functions.

A script written for `torchrun --nproc-per-node N` reads its identity from the environment
(`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, ...), picks its GPU with `torch.cuda.set_device(LOCAL_RANK)`
and calls `dist.init_process_group()`. Without that environment, Accelerate and transformers
quietly run single-process on every rank. `environment()` is the set torchrun's elastic agent
writes (`torch/distributed/elastic/agent/server/local_elastic_agent.py`), filled in from the
rank's `RankSpec`; `device_plan()` is the device each rank uses; `init_difference()` compares a
user's `init_process_group(...)` call with the group distnb made. No torch here, so all three are
tested in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from distnb.errors import ConfigError
from distnb.records.cell import RankSpec

__all__ = [
    "TORCHRUN_VARS",
    "DevicePlan",
    "InitCall",
    "device_plan",
    "environment",
    "init_difference",
]

# Every variable torchrun's agent sets for a worker (torch 2.13), in its order. Left out:
# TORCHELASTIC_ERROR_FILE and TORCHELASTIC_SIGNALS_TO_HANDLE, which only the agent reads back.
TORCHRUN_VARS = (
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "LOCAL_RANK",
)


def environment(spec: RankSpec, device: str, inherited: Mapping[str, str]) -> dict[str, str]:
    """The variables to set on rank `spec.rank`, whose device is `device` ("cpu", "cuda:0").

    MASTER_ADDR/MASTER_PORT name the kernel's control-plane store with
    TORCHELASTIC_USE_AGENT_STORE=True, as torchrun names its agent's store: an `env://`
    rendezvous that reaches torch without distnb (a library holding torch's own
    `init_process_group`) connects to it as a client. Ranks are grouped by host, so a host is a
    torchrun "node" of `local_world_size` ranks. Ranks on CPU also get ACCELERATE_USE_CPU, as
    `accelerate launch --cpu` sets it: without it `Accelerator()` ignores the process group on
    a machine without GPUs.
    """
    nodes = max(1, spec.world_size // max(1, spec.local_world_size))
    env = {
        "RANK": str(spec.rank),
        "GROUP_RANK": str(spec.rank // max(1, spec.local_world_size)),
        "ROLE_RANK": str(spec.rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "WORLD_SIZE": str(spec.world_size),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": spec.store_host,
        "MASTER_PORT": str(spec.store_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": spec.session_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "LOCAL_RANK": str(spec.local_rank),
    }
    if device == "cpu" and "ACCELERATE_USE_CPU" not in inherited:
        env["ACCELERATE_USE_CPU"] = "true"
    ifname = interface_towards(spec.store_host)
    for name in SOCKET_IFNAME_VARS:
        if ifname is not None and name not in inherited:
            env[name] = ifname
    return env


# Where gloo and NCCL open their sockets. Unset, gloo takes the address the host name resolves
# to, which on a machine of several networks may be one the other hosts cannot reach.
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_towards(address: str) -> str | None:
    """The network interface this host reaches `address` through (the kernel's control plane,
    which every rank reaches): the one whose address the route to it leaves from."""
    route = route_to(address)
    return route[0] if route is not None else None


def route_to(address: str) -> tuple[str, str] | None:
    """(interface, local address) of the route from this host to `address`."""
    import socket

    import psutil

    try:
        with socket.socket(
            socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM
        ) as probe:
            probe.connect((address, 9))  # UDP: picks the route, sends nothing
            local = str(probe.getsockname()[0])
    except OSError:
        return None
    names = [
        n
        for n, addrs in psutil.net_if_addrs().items()
        if any(str(a.address).split("%")[0] == local for a in addrs)
    ]
    return (str(names[0]), local) if names else None


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """The device a rank computes on, and the GPU behind it as `nvidia-smi` numbers it."""

    device: str  # "cpu" or "cuda:<index among the visible devices>"
    physical_gpu: str | None = None

    @property
    def cuda_index(self) -> int | None:
        return int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None


def device_plan(
    backend: str, rank: int, local_rank: int, visible_gpus: int, cuda_visible: str | None
) -> DevicePlan:
    """Where rank `rank` runs, as under torchrun's default mode.

    torchrun leaves CUDA_VISIBLE_DEVICES as the launcher had it (every local GPU visible to every
    worker) and sets LOCAL_RANK; scripts then call `torch.cuda.set_device(LOCAL_RANK)`. So a
    NCCL rank uses `cuda:<local_rank>` of the devices it sees, and the physical GPU is that
    entry of CUDA_VISIBLE_DEVICES (or the index itself without it). gloo ranks use the CPU.
    """
    if backend != "nccl":
        return DevicePlan("cpu")
    if local_rank >= visible_gpus:
        shown = f" (CUDA_VISIBLE_DEVICES={cuda_visible})" if cuda_visible is not None else ""
        raise ConfigError(
            f"rank {rank} is local rank {local_rank} on its host and needs CUDA device "
            f"{local_rank}, but it sees {visible_gpus} device(s){shown}. Start at most "
            f"{visible_gpus} ranks per host, widen CUDA_VISIBLE_DEVICES, or use --backend gloo."
        )
    ids = [part.strip() for part in cuda_visible.split(",")] if cuda_visible else []
    physical = ids[local_rank] if local_rank < len(ids) else str(local_rank)
    return DevicePlan(f"cuda:{local_rank}", physical)


@dataclass(frozen=True, slots=True)
class InitCall:
    """What a user's `init_process_group(...)` asked for, as plain values (None: not asked)."""

    backend: str | None = None
    init_method: str | None = None
    world_size: int = -1
    rank: int = -1
    store: bool = False
    device: str | None = None


def init_difference(asked: InitCall, backend: str, rank: int, world_size: int, device: str) -> str:
    """Why `asked` is not the process group this rank has ("" when it is).

    `env://` or no init_method, no store, and the backend, rank, world size and device the group
    has (or none given) all describe distnb's group; anything else would be another group.
    """
    differences = []
    names = _backend_names(asked.backend)
    if names and backend not in names:
        differences.append(f"backend {asked.backend!r} (the group's backend is {backend!r})")
    if asked.init_method not in (None, "", "env://"):
        differences.append(f"init_method {asked.init_method!r} (ranks rendezvous through env://)")
    if asked.store:
        differences.append("a store of its own (the group rendezvoused through the session's)")
    if asked.world_size not in (-1, world_size):
        differences.append(f"world_size={asked.world_size} (the group has {world_size} ranks)")
    if asked.rank not in (-1, rank):
        differences.append(f"rank={asked.rank} (this process is rank {rank})")
    if asked.device is not None and asked.device != device:
        differences.append(f"device_id={asked.device} (this rank's device is {device})")
    return "; ".join(differences)


def _backend_names(spec: str | None) -> set[str]:
    """`"gloo"` -> {"gloo"}; `"cpu:gloo,cuda:nccl"` -> {"gloo", "nccl"}; None -> set()."""
    if not spec:
        return set()
    return {part.split(":")[-1].strip().lower() for part in spec.split(",") if part.strip()}
