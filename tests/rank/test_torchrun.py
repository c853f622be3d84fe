"""torchrun's worker environment, devices and `init_process_group` calls: pure functions."""

from __future__ import annotations

import pytest

from distnb.errors import ConfigError
from distnb.rank.torchrun import (
    TORCHRUN_VARS,
    DevicePlan,
    InitCall,
    device_plan,
    environment,
    init_difference,
)
from distnb.records.cell import RankSpec


def spec(rank: int, local_rank: int, world: int = 4, local_world: int = 2) -> RankSpec:
    return RankSpec(rank, world, local_rank, local_world, "gloo", "10.0.0.1", 4321, "distnb-ab12")


def test_environment_is_torchruns_for_two_hosts_of_two_ranks() -> None:
    env = environment(spec(3, 1), "cpu", {})
    assert set(TORCHRUN_VARS) <= set(env)
    assert {k: env[k] for k in TORCHRUN_VARS} == {
        "RANK": "3",
        "GROUP_RANK": "1",  # the second host: torchrun's node rank
        "ROLE_RANK": "3",
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "4",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "4321",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "distnb-ab12",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "LOCAL_RANK": "1",
    }


def test_cpu_ranks_tell_accelerate_to_use_the_cpu_unless_the_user_chose() -> None:
    assert environment(spec(0, 0), "cpu", {})["ACCELERATE_USE_CPU"] == "true"
    assert "ACCELERATE_USE_CPU" not in environment(spec(0, 0), "cuda:0", {})
    assert "ACCELERATE_USE_CPU" not in environment(spec(0, 0), "cpu", {"ACCELERATE_USE_CPU": "0"})
    kept = environment(spec(0, 0), "cpu", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert kept["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


@pytest.mark.parametrize(
    ("backend", "local_rank", "gpus", "visible", "plan"),
    [
        ("gloo", 1, 0, None, DevicePlan("cpu")),
        ("gloo", 1, 8, "0,1", DevicePlan("cpu")),  # gloo ranks compute on the CPU
        ("nccl", 1, 8, None, DevicePlan("cuda:1", "1")),
        ("nccl", 1, 2, "4,6", DevicePlan("cuda:1", "6")),  # index among the visible ones
        ("nccl", 0, 1, "GPU-5f3e", DevicePlan("cuda:0", "GPU-5f3e")),
    ],
)
def test_device_plan_is_torchruns_default_mode(
    backend: str, local_rank: int, gpus: int, visible: str | None, plan: DevicePlan
) -> None:
    assert device_plan(backend, 3, local_rank, gpus, visible) == plan


def test_device_plan_without_enough_gpus_says_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        device_plan("nccl", 3, 2, 2, "4,6")
    message = str(info.value)
    assert "rank 3 is local rank 2" in message and "sees 2 device(s)" in message
    assert "CUDA_VISIBLE_DEVICES=4,6" in message and "--backend gloo" in message


def test_cuda_index() -> None:
    assert DevicePlan("cuda:3", "3").cuda_index == 3 and DevicePlan("cpu").cuda_index is None


@pytest.mark.parametrize(
    "asked",
    [
        InitCall(),
        InitCall("gloo"),
        InitCall("GLOO", "env://", 2, 1),
        InitCall("cpu:gloo,cuda:nccl"),
        InitCall(device="cpu"),
    ],
)
def test_init_calls_that_ask_for_the_existing_group(asked: InitCall) -> None:
    assert init_difference(asked, "gloo", 1, 2, "cpu") == ""


@pytest.mark.parametrize(
    ("asked", "words"),
    [
        (InitCall("nccl"), "backend 'nccl' (the group's backend is 'gloo')"),
        (InitCall(init_method="tcp://10.0.0.1:23456"), "init_method 'tcp://10.0.0.1:23456'"),
        (InitCall(store=True), "a store of its own"),
        (InitCall(world_size=4), "world_size=4 (the group has 2 ranks)"),
        (InitCall(rank=0), "rank=0 (this process is rank 1)"),
        (InitCall(device="cuda:1"), "device_id=cuda:1 (this rank's device is cpu)"),
    ],
)
def test_init_calls_for_another_group_name_the_difference(asked: InitCall, words: str) -> None:
    assert words in init_difference(asked, "gloo", 1, 2, "cpu")


def test_every_difference_is_named() -> None:
    text = init_difference(InitCall("nccl", world_size=8, rank=5), "gloo", 1, 2, "cpu")
    assert text.count(";") == 2 and "nccl" in text and "world_size=8" in text and "rank=5" in text
