"""torchrun-compatible ranks on a real 2-rank gloo cluster: the environment, user code's own
`init_process_group`/`destroy_process_group`, and real Accelerate and transformers on top."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from distnb.errors import CollectiveDesyncError, CollectiveMismatchError, RankError
from distnb.rank.torchrun import TORCHRUN_VARS
from harness import frameworks

if TYPE_CHECKING:
    from distnb.session import Session
    from distnb.session.runs.request import CellResult

pytestmark = pytest.mark.cluster


def per_rank_json(session: Session, code: str) -> list[object]:
    """Run `code`, whose last line prints one JSON value per rank; the values in rank order."""
    return values(session.run(code))


def values(result: CellResult) -> list[object]:
    return [json.loads(result.stdout(r).strip().splitlines()[-1]) for r in (0, 1)]


def test_every_rank_has_torchruns_environment(session: Session) -> None:
    envs = per_rank_json(
        session,
        f"import os, json\nprint(json.dumps({{k: os.environ.get(k) for k in {TORCHRUN_VARS!r}}}))",
    )
    for rank, env in enumerate(envs):
        assert isinstance(env, dict)
        assert None not in env.values(), env
        assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (str(rank), str(rank), "0")
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == ("2",) * 3
        assert env["GROUP_WORLD_SIZE"] == "1"
        assert env["TORCHELASTIC_RUN_ID"].startswith("distnb-")
        assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"]  # type: ignore[index]


def test_init_process_group_asking_for_the_group_that_exists_returns(
    session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    session.run(
        "dist.init_process_group()\n"
        "dist.init_process_group('gloo')\n"
        "dist.init_process_group(backend='gloo', init_method='env://', world_size=2, rank=rank)\n"
        "x = torch.ones(1)\n"
        "dist.all_reduce(x)\n"
        "print(dist.get_backend(), dist.get_world_size(), x.item())"
    )
    assert "[ranks 0-1] gloo 2 2.0" in capsys.readouterr().out


def test_init_process_group_for_another_group_names_the_difference(session: Session) -> None:
    with pytest.raises(RankError) as info:
        session.run(
            "dist.init_process_group('nccl', init_method='tcp://127.0.0.1:1', world_size=4)"
        )
    message = info.value.message
    assert "ValueError: init_process_group asks for another process group" in message
    assert "backend 'nccl' (the group's backend is 'gloo')" in message
    assert "init_method 'tcp://127.0.0.1:1'" in message and "world_size=4" in message


def test_destroy_process_group_leaves_a_working_checked_group(
    session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    session.run("dist.destroy_process_group()\nprint('after destroy:', dist.is_initialized())")
    assert "[ranks 0-1] after destroy: False" in capsys.readouterr().out  # as under torchrun
    session.run("x = torch.ones(2)\ndist.all_reduce(x)\nprint(x.tolist(), dist.get_world_size())")
    assert "[ranks 0-1] [2.0, 2.0] 2" in capsys.readouterr().out
    with pytest.raises(CollectiveMismatchError):  # still checked
        session.run("dist.all_reduce(torch.ones(2 + rank))")
    # destroyed and made again in one cell, with a sub-group made after it
    session.run(
        "dist.destroy_process_group()\n"
        "dist.init_process_group('gloo')\n"
        "pair = dist.new_group([0, 1])\n"
        "x = torch.ones(1)\n"
        "dist.all_reduce(x, group=pair)\n"
        "print('again:', x.item())"
    )
    assert "[ranks 0-1] again: 2.0" in capsys.readouterr().out


def test_the_groups_a_destroy_takes_with_it_are_said_in_one_line(
    session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = "pair = dist.new_group([0, 1])"
    session.run("dist.destroy_process_group()")  # from no group but the default (shared session)
    session.run(made)
    capsys.readouterr()
    session.run("dist.destroy_process_group()")  # a cell's: the cells' pair went with it
    said = capsys.readouterr()
    assert (
        "[ranks 0-1] distnb: this cell's destroy_process_group() also ended the process group "
        "the cells made with dist.new_group; distnb makes the default group again, not those: "
        "make them again before you use them"
    ) in said.out + said.err
    session.run(made)
    script = tmp_path / "ends.py"  # a torchrun script's end: its own group is no news
    script.write_text(f"import torch.distributed as dist\n{made}\ndist.destroy_process_group()\n")
    capsys.readouterr()
    session.run_script(str(script))
    said = capsys.readouterr()
    assert "the run's destroy_process_group() also ended the process group the cells" in (
        said.out + said.err
    )
    session.run("dist.destroy_process_group()")  # nothing besides the default: nothing said
    said = capsys.readouterr()
    assert "distnb:" not in said.out + said.err
    result = session.run(f"{made}\nx = torch.ones(1)\ndist.all_reduce(x, group=pair)\nx.item()")
    assert result.result(0) == result.result(1) == "2.0"


def test_destroy_on_one_rank_only_is_named(session: Session) -> None:
    with pytest.raises(CollectiveDesyncError) as info:
        session.run("if rank == 0:\n    dist.destroy_process_group()\n")
    assert "rank 1 finished the cell without calling barrier" in info.value.message
    assert "line 2" in info.value.message
    result = session.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()")
    assert result.result(0) == result.result(1) == "2.0"


# a user's Accelerate loop (harness.frameworks), ending with what each rank's Accelerate says
ACCELERATE_STATE = frameworks.ACCELERATE.replace(
    "END",
    """gathered = accelerator.gather(torch.tensor([float(rank)]))
print(json.dumps([
    accelerator.distributed_type == DistributedType.MULTI_CPU,
    accelerator.process_index, accelerator.local_process_index, accelerator.num_processes,
    type(model).__name__, gathered.tolist(), len(loader),
    [round(p.sum().item(), 6) for p in model.parameters()],
]))""",
)


def test_accelerate_runs_one_process_per_rank(session: Session) -> None:
    pytest.importorskip("accelerate")
    code = "import json\nfrom accelerate.utils import DistributedType\n" + ACCELERATE_STATE
    states = per_rank_json(session, code)
    for rank, state in enumerate(states):
        assert isinstance(state, list)
        multi_cpu, index, local_index, processes, wrapper, gathered, batches, _ = state
        assert multi_cpu and (index, local_index, processes) == (rank, rank, 2)
        assert wrapper == "DistributedDataParallel"
        assert gathered == [0.0, 1.0]
        assert batches == 2  # 4 batches, sharded over 2 ranks
    assert states[0][-1] == states[1][-1]  # type: ignore[index]  # DDP kept them in step
    partial = per_rank_json(
        session,
        "from accelerate import PartialState\nimport json\n"
        "s = PartialState(cpu=True)\n"
        "print(json.dumps([str(s.distributed_type), s.process_index, s.num_processes]))",
    )
    assert partial == [["DistributedType.MULTI_CPU", 0, 2], ["DistributedType.MULTI_CPU", 1, 2]]


TRAINER = """\
import json, os, tempfile
import transformers
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
transformers.logging.set_verbosity_error()
config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, num_labels=2)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
g = torch.Generator().manual_seed(1)
rows = [{"input_ids": torch.randint(0, 32, (8,), generator=g), "labels": i % 2} for i in range(16)]
with tempfile.TemporaryDirectory() as output_dir:
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=4, max_steps=3,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    out = Trainer(model=model, args=args, train_dataset=rows).train()
print(json.dumps([args.world_size, str(args.parallel_mode), out.global_step,
                  round(sum(p.sum().item() for p in model.parameters()), 5)]))
"""


def test_trainer_trains_on_both_ranks_with_checked_collectives(session: Session) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from distnb.rank import runtime

    run = session.run(TRAINER)
    results = values(run)
    for result in results:
        assert isinstance(result, list)
        assert result[:3] == [2, "ParallelMode.DISTRIBUTED", 3]
    assert results[0][3] == results[1][3]  # type: ignore[index]  # same weights on both ranks
    events = session.call(runtime.events, run.run_id)
    for rank_events in events:
        buckets = [e for e in rank_events if e.origin.startswith("DDP gradient bucket")]
        assert len(buckets) >= 3  # a checked reduction per step at least
