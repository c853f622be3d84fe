"""torch's config modules, the random generators and the process groups a run makes (torch's
global switches: `switches.py`).

Swapped for a run: the values in torch's config modules (`torch._dynamo.config`, ...). The
random generators get a new seed from the operating system at the start of a run, as a fresh
process does (torch 2.13 seeds its default generator so too, as do Python's `random` and
numpy), and the cells' generators are put back after it, so a run leaves the cells' random
sequence where it was. Process groups a run made and left are destroyed when it ends, as they
end with a torchrun worker.
"""

from __future__ import annotations

import copy
import random
import sys
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

__all__ = ["PARTS"]


class ConfigPart:
    """torch's config modules (`torch._dynamo.config`, `torch._inductor.config`, ...), as far as
    they are loaded: the values that differ are set back."""

    name = "torch config modules"

    def capture(self) -> dict[str, dict[str, Any]]:
        from torch.utils._config_module import ConfigModule

        return {
            name: _values(module)
            for name, module in list(sys.modules.items())
            if isinstance(module, ConfigModule)
        }

    def fresh(self, joined: dict[str, dict[str, Any]]) -> None:
        self.restore(joined)

    def restore(self, saved: dict[str, dict[str, Any]]) -> None:
        for name, values in saved.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            now = _values(module)
            for key, value in values.items():
                if key in now and now[key] is not value and now[key] != value:
                    setattr(module, key, copy.deepcopy(value))  # ours, not the cache's


def _values(module: Any) -> dict[str, Any]:
    """A config module's values: torch's cached read-only copy where it has one (a run reads
    ~1,000 values of dynamo's and inductor's four times), else a copy."""
    try:
        return dict(module._get_dict(readonly_values=True))
    except (AttributeError, TypeError):
        return dict(module.get_config_copy())


class RandomPart:
    """The random generators: seeded anew from the OS for a run, the cells' put back after."""

    name = "random generators"

    def capture(self) -> tuple[Any, Any, Any, Any]:
        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        cuda = torch.cuda.get_rng_state_all() if initialized else None
        return torch.get_rng_state(), cuda, random.getstate(), _numpy_state()

    def fresh(self, joined: tuple[Any, Any, Any, Any]) -> None:
        torch.seed()  # a seed from the OS, on every device
        random.seed()
        numpy = sys.modules.get("numpy.random")
        if numpy is not None:
            numpy.seed()

    def restore(self, saved: tuple[Any, Any, Any, Any]) -> None:
        cpu, cuda, python, numpy = saved
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(python)
        if numpy is not None and "numpy.random" in sys.modules:
            sys.modules["numpy.random"].set_state(numpy)


def _numpy_state() -> Any:
    numpy = sys.modules.get("numpy.random")
    return numpy.get_state() if numpy is not None else None


class GroupsPart:
    """Process groups a run made (`new_group`, a device mesh's) and did not destroy: destroyed
    when it ends. The default group is distnb's (`distnb.rank.world` makes it again if a
    script destroyed it) and the cells' groups stay theirs."""

    name = "process groups"
    carried = False  # a run starts with the groups there are (`reset.Part`)

    def capture(self) -> list[Any]:
        """The groups there are besides the default."""
        return [pg for pg in c10d._world.pg_map if pg is not c10d.GroupMember.WORLD]

    def fresh(self, joined: list[Any]) -> None:
        """A run starts with the groups there are: the cells' are theirs to keep."""

    def restore(self, saved: list[Any]) -> None:
        kept = {id(pg) for pg in saved}
        default = c10d.GroupMember.WORLD
        for pg in list(c10d._world.pg_map):
            if id(pg) not in kept and pg is not default:
                c10d.destroy_process_group(pg)  # torch's own for a group that is not WORLD
        now = {id(pg) for pg in c10d._world.pg_map}
        lost = [pg for pg in saved if id(pg) not in now]
        if lost:  # the run's destroy_process_group() ended them, as it would under torchrun
            print(lost_groups("the run's", len(lost)), file=sys.stderr)


def lost_groups(whose: str, count: int) -> str:
    """The one line that says which groups a destroy_process_group() took with it."""
    groups = "process group" if count == 1 else f"{count} process groups"
    return (
        f"distnb: {whose} destroy_process_group() also ended the {groups} the cells made with "
        "dist.new_group; distnb makes the default group again, not those: make them again "
        "before you use them"
    )


PARTS = (ConfigPart(), RandomPart(), GroupsPart())
