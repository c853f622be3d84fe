"""`Session.pull` / `push` and `%dist_pull` / `%dist_push` on a real 2-rank gloo cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from IPython.core.error import UsageError

from distnb.errors import ConfigError
from distnb.session.data import parse_size

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

# the tests that take a session start real engines; parse_size's do not
cluster = pytest.mark.cluster

REFUSED = (ConfigError, UsageError)  # the method's error, and the magic's


class Data:
    """Pulls and pushes through the Python API or through the magics."""

    def __init__(self, how: str, session: Session, shell: InteractiveShell) -> None:
        self.how, self.session, self.shell = how, session, shell

    def pull(self, name: str, ranks: str = "", limit: str = "") -> list[Any]:
        if self.how == "python":
            return self.session.pull(
                name,
                ranks=[int(r) for r in ranks.split(",")] if ranks else None,
                limit=parse_size(limit) if limit else None,
            )
        flags = (f" --ranks {ranks}" if ranks else "") + (f" --limit {limit}" if limit else "")
        self.shell.run_line_magic("dist_pull", f"{name} --as pulled{flags}")
        return list(self.shell.user_ns.pop("pulled"))

    def push(self, ranks: str = "", limit: str = "", **values: Any) -> None:
        if self.how == "python":
            self.session.push(
                ranks=[int(r) for r in ranks.split(",")] if ranks else None,
                limit=parse_size(limit) if limit else None,
                **values,
            )
            return
        self.shell.user_ns.update(values)
        flags = (f" --ranks {ranks}" if ranks else "") + (f" --limit {limit}" if limit else "")
        self.shell.run_line_magic("dist_push", " ".join(values) + flags)


@pytest.fixture(params=["python", "magic"])
def data(request: pytest.FixtureRequest, session: Session, shell: InteractiveShell) -> Data:
    return Data(request.param, session, shell)


@cluster
def test_pull_gives_each_rank_value_in_rank_order(data: Data, session: Session) -> None:
    session.run("losses = [1.0 / (step + 1 + rank) for step in range(4)]")
    losses = data.pull("losses")
    assert losses == [[1 / (s + 1 + r) for s in range(4)] for r in (0, 1)]
    assert data.pull("losses", ranks="1") == [losses[1]]


@cluster
def test_pulled_tensors_are_on_the_cpu_detached_and_only_their_own_elements(
    data: Data, session: Session
) -> None:
    session.run(
        "model = torch.nn.Linear(3, 2)\n"
        "big = torch.arange(1_000_000.0) * (rank + 1)\n"
        "batch = {'x': big[:3], 'ys': [big[3:5]]}"
    )
    bias = data.pull("model.bias")
    assert [tuple(b.shape) for b in bias] == [(2,), (2,)]
    assert not bias[0].requires_grad and bias[0].device.type == "cpu"
    batch = data.pull("batch", limit="1KiB")  # `big` is 3.8 MiB: only the slices travel
    assert batch[1]["x"].tolist() == [0.0, 2.0, 4.0]
    assert batch[1]["ys"][0].tolist() == [6.0, 8.0]
    assert batch[0]["x"].untyped_storage().nbytes() == 12


@cluster
def test_push_binds_values_on_the_ranks(
    data: Data, session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    data.push(lr=0.25, scale=torch.tensor([2.0, 3.0]))
    session.run("print(rank, lr, (scale * (rank + 1)).tolist())")
    out = capsys.readouterr().out
    assert "[rank 0] 0 0.25 [2.0, 3.0]" in out and "[rank 1] 1 0.25 [4.0, 6.0]" in out
    data.push(ranks="1", lr=0.5)
    session.run("print(rank, lr)")
    out = capsys.readouterr().out
    assert "[rank 0] 0 0.25" in out and "[rank 1] 1 0.5" in out


@cluster
def test_push_sends_functions_defined_in_the_kernel(session: Session) -> None:
    offset = 10
    session.push(shift=lambda x: x + offset)
    session.run("shifted = shift(rank)")
    assert session.pull("shifted") == [10, 11]


@cluster
def test_per_rank_losses_plot_in_the_kernel(session: Session) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    session.push(steps=5)
    session.run("curve = torch.linspace(1, 0, steps) * (rank + 1)")
    fig, ax = plt.subplots()
    for rank, curve in enumerate(session.pull("curve")):
        ax.plot(curve.numpy(), label=f"rank {rank}")
    assert [line.get_label() for line in ax.lines] == ["rank 0", "rank 1"]
    assert ax.lines[1].get_ydata()[0] == 2.0
    plt.close(fig)


@cluster
def test_too_large_names_the_value_its_size_the_limit_and_the_fix(
    data: Data, session: Session
) -> None:
    session.run("h = torch.zeros(64, 1024)")
    with pytest.raises(REFUSED) as info:
        data.pull("h", limit="64KiB")
    message = str(info.value)
    assert "'h' on ranks 0-1 (tensor float32[64, 1024]) is 256.0 KiB" in message
    assert "over the 64.0 KiB limit per rank" in message
    assert "--limit 1GiB" in message and "limit=2**30" in message
    with pytest.raises(
        REFUSED,
        match=r"cannot push 'payload' \(bytes\): it is 2\.\d KiB pickled, over the 1\.0 KiB",
    ):
        data.push(limit="1KiB", payload=b"x" * 2048)


@cluster
def test_unpicklable_and_missing_values_say_what_to_do(data: Data, session: Session) -> None:
    session.run("import threading\nlock = threading.Lock()\nif rank == 0:\n    only0 = 1")
    with pytest.raises(REFUSED) as info:
        data.pull("lock")
    assert "'lock' on ranks 0-1 (_thread.lock) does not pickle (TypeError: cannot" in str(
        info.value
    )
    assert "assign a picklable part of it in an %%allranks cell" in str(info.value)
    with pytest.raises(REFUSED, match="rank 1 has no 'only0'; assign it in an %%allranks cell"):
        data.pull("only0")
    with pytest.raises(REFUSED, match="'Linear' object has no attribute 'nothing'"):
        session.run("model = torch.nn.Linear(3, 2)")
        data.pull("model.nothing")
    import threading

    with pytest.raises(REFUSED, match=r"cannot push 'lk' \(_thread.lock\): it does not pickle"):
        data.push(lk=threading.Lock())


@cluster
def test_rank_only_classes_cannot_be_rebuilt_in_the_kernel(session: Session) -> None:
    session.run("class Point:\n    pass\np = Point()")
    with pytest.raises(ConfigError, match=r"rank 0's 'p' \(__main__.Point\) cannot be rebuilt"):
        session.pull("p")


@cluster
def test_bad_arguments(session: Session, shell: InteractiveShell) -> None:
    with pytest.raises(ConfigError, match="a name or dotted path"):
        session.pull("x[0]")
    with pytest.raises(ConfigError, match="rank, world_size are the rank's own"):
        session.push(rank=1, world_size=3)
    with pytest.raises(ConfigError, match="needs values to send"):
        session.push()
    with pytest.raises(ConfigError, match="limit is a number of bytes"):
        session.pull("x", limit=0)
    with pytest.raises(UsageError, match="the kernel has no not_defined_here"):
        shell.run_line_magic("dist_push", "not_defined_here")
    with pytest.raises(UsageError, match="--limit: a size is a number with a unit"):
        shell.run_line_magic("dist_pull", "x --limit lots")
    with pytest.raises(UsageError, match="Usage: %dist_pull"):
        shell.run_line_magic("dist_pull", "")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000", 1000),
        ("64MiB", 64 * 2**20),
        ("2G", 2 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("512 KiB", 512 * 1024),
        ("10b", 10),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size
