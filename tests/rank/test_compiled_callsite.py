"""Where a mismatch inside a `torch.compile`d function is reported, on two real gloo ranks.

A compiled graph runs generated code (`<eval_with_key>.N` for FX graphs, a module in inductor's
cache): the report must name the user's line that the graph's node was traced from, and the line
that called the compiled function, whatever the backend, and never another program's line when
inductor's cache serves a graph compiled elsewhere.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness.gloo import Outcome, Ranks

pytestmark = pytest.mark.gloo

HERE = Path(__file__).resolve()


def line_of(text: str, path: Path = HERE) -> int:
    """The number of the one line of `path` that ends with `text`."""
    found = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.endswith(text)]
    assert len(found) == 1, (text, found)
    return found[0]


@pytest.fixture(scope="module")
def ranks() -> Iterator[Ranks]:
    with Ranks(__file__, world=2) as r:
        yield r


def values(outcomes: list[Outcome]) -> list[Any]:
    return [o.unwrap() for o in outcomes]


def sites(outcomes: list[Outcome]) -> list[tuple[str, int, str]]:
    """Each rank's (file, line, origin) as its `CollectiveMismatchError` names them."""
    found = []
    for o in outcomes:
        assert o.error == "CollectiveMismatchError", (o.error, o.message)
        mine = next(f for f in o.data["fingerprints"] if f["rank"] == o.rank)
        found.append((mine["site"]["file"], mine["site"]["line"], mine["origin"]))
    return found


# --- a compiled function as users write it: a helper the graph inlines, called from the body --


def _reduce(y: torch.Tensor) -> None:
    dist.all_reduce(y)  # the collective's line


def _step(x: torch.Tensor) -> torch.Tensor:
    y = x * 3.25  # a constant of its own: inductor's cache holds no other function's graph
    _reduce(y)
    return y + 1


def s_compiled_mismatch(rank: int, backend: str) -> Any:
    torch._dynamo.reset()
    step = torch.compile(_step, backend=backend)
    return step(torch.ones(4 if rank == 0 else 5))  # the compiled function's call


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_compiled_mismatch_names_the_users_line_and_the_call(ranks: Ranks, backend: str) -> None:
    outcomes = ranks.run(s_compiled_mismatch, timeout=240, backend=backend)
    collective, call = line_of("# the collective's line"), line_of("# the compiled function's call")
    origin = f"compiled graph, called at {HERE}:{call}"
    assert sites(outcomes) == [(str(HERE), collective, origin)] * 2
    message = outcomes[0].message
    assert re.match(
        rf"shape mismatch in all_reduce #\d+ on WORLD \({re.escape(origin)}\): ", message
    )
    assert message.count(f"at {HERE}:{collective}: dist.all_reduce(y)") == 2
    assert "eval_with_key" not in message and "torchinductor" not in message


# --- inductor's cache: a graph compiled before, from another file or another function ---------
# Inductor's cache serves a graph with the stack traces of its first compile (they are not part of
# its key). Each scenario compiles a graph, then one that the cache serves on rank 0 (and notes
# that it did); rank 1's has another shape: compiled now, or cached by an earlier run of the test.

_CACHE_HITS: dict[str, int] = {}


def _cache_hits() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]) + int(
        counters["aot_autograd"]["autograd_cache_hit"]
    )


def s_cache_hits(rank: int) -> dict[str, int]:
    return dict(_CACHE_HITS)


STEPS = """import torch
import torch.distributed as dist


def step(x):
    y = x * 5.75
    dist.all_reduce(y)
    return y - 1
"""
STEPS_LINE = STEPS.splitlines().index("    dist.all_reduce(y)") + 1


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"steps_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def s_cached_from_another_file(rank: int) -> Any:
    """`step` compiled from a first file, which then goes; the same source in a second file
    gets the first compile's graph, with the first file's name in its stack traces."""
    folder = Path(tempfile.mkdtemp(prefix=f"distnb-steps-{rank}-"))
    try:
        first, second = folder / "first.py", folder / "second.py"
        for path in (first, second):
            path.write_text(STEPS)
        torch._dynamo.reset()
        torch.compile(_load(first).step)(torch.ones(6))  # alike on both ranks
        first.unlink()
        torch._dynamo.reset()
        hits = _cache_hits()
        try:
            torch.compile(_load(second).step)(torch.ones(6 if rank == 0 else 7))
        finally:
            _CACHE_HITS["file"] = _cache_hits() - hits
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_cached_graph_names_the_lines_of_the_file_that_runs_it(ranks: Ranks) -> None:
    outcomes = ranks.run(s_cached_from_another_file, timeout=240)
    assert values(ranks.run(s_cache_hits))[0]["file"] > 0
    for o, (file, line, _) in zip(outcomes, sites(outcomes), strict=True):
        assert Path(file).parent.name.startswith(f"distnb-steps-{o.rank}-")
        assert (Path(file).name, line) == ("second.py", STEPS_LINE)


def _first(x: torch.Tensor) -> torch.Tensor:
    y = x * 8.5
    dist.all_reduce(y)  # the first function's line
    return y + 2


def _second(x: torch.Tensor) -> torch.Tensor:
    y = x * 8.5
    dist.all_reduce(y)  # the second function's line
    return y + 2


def s_cached_from_another_function(rank: int) -> Any:
    """Two functions that make the same graph: the second gets the first's, with its lines."""
    torch._dynamo.reset()
    torch.compile(_first)(torch.ones(3))  # alike on both ranks
    torch._dynamo.reset()
    second = torch.compile(_second)
    hits = _cache_hits()
    try:
        return second(torch.ones(3 if rank == 0 else 2))  # the second function's call
    finally:
        _CACHE_HITS["function"] = _cache_hits() - hits


def test_a_graph_cached_from_another_function_names_the_call_not_its_lines(
    ranks: Ranks,
) -> None:
    rank0, rank1 = sites(ranks.run(s_cached_from_another_function, timeout=240))
    assert values(ranks.run(s_cache_hits))[0]["function"] > 0
    call = line_of("# the second function's call")
    # rank 0 runs the first function's graph: its recorded lines are not this call's
    assert rank0 == (str(HERE), call, "compiled graph")
    assert rank1 == (
        str(HERE),
        line_of("# the second function's line"),
        f"compiled graph, called at {HERE}:{call}",
    )


def test_a_recorded_stack_from_another_install_skips_its_torch_frames(tmp_path: Path) -> None:
    """A cached graph compiled by a process with torch installed elsewhere (another checkout's
    virtualenv on the same machine) records that torch's files: they are a library's, not the
    user's, although they exist and read as recorded."""
    from torch.distributed import _functional_collectives as funcol

    from distnb.rank.checked import callsite

    other = tmp_path / "other" / ".venv" / "lib" / "python3.11" / "site-packages" / "torch"
    (other / "distributed").mkdir(parents=True)
    theirs = other / "distributed" / "_functional_collectives.py"
    shutil.copy(funcol.__file__, theirs)
    line = next(
        n for n, text in enumerate(theirs.read_text().splitlines(), 1) if "all_reduce(" in text
    )
    user = line_of("# the collective's line")
    recorded = (  # innermost first, as `graphs.recorded_stack` returns it
        (str(theirs), line, "all_reduce", theirs.read_text().splitlines()[line - 1]),
        (str(HERE), user, "_reduce", "dist.all_reduce(y)  # the collective's line"),
        (str(HERE), user + 5, "_step", "_reduce(y)"),
    )
    site = callsite._traced(recorded, str(HERE))
    assert site is not None and site[:2] == (str(HERE), user)
