"""`%dist_attach --debug` typed at as a user types, in a real Jupyter kernel driven as a frontend,
on the stopped rank of a real torchrun job, for each way a rank stops (its next collective,
`--at now`, a breakpoint): each command acts on its first keystroke. The first `n` shows the next
line, `p` its value, the first `c` lets the rank go on (both ranks finish their steps), and no
bare `(Pdb)` prompt comes twice in a row. Issue 47: the desk read each open prompt again while
asking it, and asked it again at once (the rank's answer to the first keystroke not shown yet);
the second keystroke went to a prompt the rank had left. And `n` over a collective, with the
peer held before it, ended `--debug` with the rank still on its way to the next line."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from harness.jobs import TRAIN, job, line_of
from harness.kernel_driver import Frontend, Reply, frontend

pytestmark = [pytest.mark.gloo, pytest.mark.notebook]

GRADS, METRICS = line_of("# the gradients"), line_of("metrics = torch.full")
LOSS, ZERO, BACKWARD = line_of("loss = model(x)"), line_of("opt.zero_grad()"), line_of("backward()")
WAIT, SLEEP = line_of('while "READY"'), line_of("time.sleep(0.01)")
AT = re.compile(rf"\[rank 0\] > {re.escape(str(TRAIN))}:(\d+), in main\(\)")


def attached(fe: Frontend, folder: Path) -> None:
    deadline = time.monotonic() + 120
    while not (folder / "endpoint.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    shown = fe.run(f"%load_ext distnb\n%dist_attach {folder}", timeout=180)
    assert shown.status == "ok", shown.text


def waiting_for_ready(fe: Frontend) -> None:
    """Both ranks in train.py's READY loop (so that `--at now` stops there)."""
    deadline = time.monotonic() + 120
    while True:
        shown = fe.run("%dist_attach").text
        lines = [f"train.py:{WAIT}", f"train.py:{SLEEP}"]
        rows = [r for r in shown.splitlines() if re.match(r"[01]\s", r)]
        if len(rows) == 2 and all(any(w in r for w in lines) for r in rows):
            return
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)


def typed(fe: Frontend) -> Reply:
    reply = fe.run("%dist_attach --debug", ["n", "n", "p step", "c"], timeout=240)
    assert reply.status == "ok", reply.transcript
    return reply


def between_prompts(transcript: str) -> list[str]:
    """What the rank showed after each line typed at its prompt, up to the next prompt."""
    return re.split(r"^\[rank 0\] \(Pdb\) .*$", transcript, flags=re.M)[1:]


@pytest.mark.parametrize("how", ["collective", "now", "break"])
def test_each_command_acts_on_its_first_keystroke(tmp_path: Path, how: str) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "ok", STEPS="3", READY=str(ready), LINGER="1") as jb, frontend() as fe:
        attached(fe, jb.folder)
        if how == "collective":
            asked = fe.run("%dist_attach --stop --ranks 0")  # rank 1 is held meanwhile
            ready.touch()
        elif how == "now":
            waiting_for_ready(fe)
            asked = fe.run("%dist_attach --stop --at now --ranks 0")
        else:  # set at step 0's first collective, met at step 1
            asked = fe.run(f'%dist_attach --break train.py:{LOSS} --if "step == 1" --ranks 0')
            ready.touch()
        assert asked.status == "ok", asked.text
        reply = typed(fe)
        after = between_prompts(reply.transcript)
        assert len(after) == 4, reply.transcript
        assert all(text.strip() for text in after[:3]), reply.transcript  # no bare `(Pdb)` twice
        stop = [int(x) for x in AT.findall(reply.transcript.split("(Pdb)")[0])]
        lines = [[int(x) for x in AT.findall(text)] for text in after[:2]]
        if how == "collective":  # `n` over the all_reduce: its held peer goes in with it
            assert stop == [GRADS] and lines == [[METRICS], [METRICS + 1]], reply.transcript
        elif how == "now":  # the READY loop: `while`, then its `sleep`, and round again
            assert stop[-1] in (WAIT, SLEEP), reply.transcript
            other = {WAIT: SLEEP, SLEEP: WAIT}
            assert lines == [[other[stop[-1]]], [stop[-1]]], reply.transcript
        else:
            assert stop == [LOSS] and lines == [[ZERO], [BACKWARD]], reply.transcript
        step = "1" if how == "break" else "0"
        assert after[2].strip() == f"[rank 0] {step}", reply.transcript
        assert not AT.search(after[3]), reply.transcript  # `c`: no prompt again
        ready.touch()  # both ranks finish their steps (and linger: the job is not judged)
        jb.wait_for(r"final 0 ")
        jb.wait_for(r"final 1 ")
