"""What an attached rank's status shows of its main thread's stack: the job's frames, down to
the library call it made, and nothing of distnb's or of what distnb's debugger called while the
rank waits at its prompt."""

from __future__ import annotations

import hmac
import pdb
import sysconfig
import traceback
from pathlib import Path

import torch.distributed.distributed_c10d as c10d

import distnb.rank.agent.serve as serve
from distnb.rank.agent.serve import users_frames

TRAIN = "/job/train.py"
C10D = c10d.__file__
SERVE = serve.__file__
HMAC = hmac.__file__
PDB = pdb.__file__
THREADING = str(Path(sysconfig.get_paths()["stdlib"]) / "threading.py")


def stack(*files: str) -> list[traceback.FrameSummary]:
    return [traceback.FrameSummary(f, i + 1, f"f{i}", line="x") for i, f in enumerate(files)]


def test_a_stopped_ranks_stack_ends_at_the_collective_it_stopped_before() -> None:
    # train.py -> all_reduce -> distnb's gate -> pdb's prompt -> the signed store's hmac
    kept = users_frames(stack(TRAIN, TRAIN, C10D, C10D, SERVE, PDB, SERVE, HMAC))
    assert [f.file for f in kept] == [TRAIN, TRAIN, C10D, C10D]
    assert [f.line for f in kept] == [1, 2, 3, 4]


def test_the_users_code_called_back_from_distnb_is_kept_with_the_libraries_it_calls() -> None:
    kept = users_frames(stack(THREADING, TRAIN, SERVE, HMAC, "/job/hook.py", THREADING))
    assert [f.file for f in kept] == [THREADING, TRAIN, "/job/hook.py", THREADING]
