"""The control plane's contract: every key of the session's store, built here and only here.

The kernel hosts a `torch.distributed.TCPStore`; the session and every rank use it under the
session's prefix (`PrefixStore(session_id, ...)`), so a restarted cluster never reads a stale key
of the one before. Kept free of torch so the kernel side imports it cheaply.

Who writes what (values in brackets):

- `pg/...`: the process group's own rendezvous (torch writes these); `pg/<epoch>/...` when a
  rank makes the default group again after user code destroyed it (`process_group`), and
  `pg-here/<epoch>/<rank>` [`1`]: each rank, on arriving to make it (`group_arrival`).
- `cell` [`encode_run`]: the kernel, before each run; every rank reads it when its cell starts.
- `stackreq/<rank>/<n>`, `stack/<rank>/<n>` [text]: the kernel asks a rank's stack server (a
  thread) for its live stack; the stack server answers.
- `check/beacon/<rank>` [`Beacon` JSON]: a rank, on long waits at a checked collective; read by
  the kernel (hang reports, the referee) and by the rank's peers (deadlocks).
- `check/abort/<run id>` [the reason, text]: the kernel, to release ranks waiting at a
  collective that a peer will never reach in that run.
- `debug/count` [a counter], `debug/ask/<n>` [`InputRequest` JSON], `debug/answer/<n>` [text]: a
  rank that wants a line from the user (its debugger's prompt, `input()`) counts up, posts its
  request under the number it got and waits for the answer; the kernel asks the user.
- `debug/cell-file` [a path, or empty]: the kernel, before each run while JupyterLab's visual
  debugger is attached to the ranks: the file name the frontend knows the cell by; each rank
  compiles the cell under it.
- `debug/dap/<channel>/<to kernel|to rank>/<n>` [a chunk of bytes]: the n-th piece of a debug
  adapter connection between the kernel and a rank on another host (`distnb.contract.relay`);
  read once and deleted.
- `replicas/...` [stamped digests, tensors, reports]: the boards of replica checks and of watches
  that raise (`replicas`).
- `check/host/<rank>` [text]: a rank's host identity, so ranks on one host use shared memory.
- `check/fp/...`, `check/big/...` [stamped fingerprints]: fingerprint slots of groups that span
  hosts and of fingerprints too big for shared memory (`board`, `spill`, `slot`).
- `repost/<rank>` [a key]: a peer, or the kernel, that read a forged value under a key `rank`
  wrote asks it to post that key's value again (`distnb.contract.posts`).

Off loopback every value is signed (`distnb.contract.signed`), and a value that fails verification
was written by something that does not hold the session's secret: a **forged** value. None is
waited on in silence. What each key's reader does about one (`role` names the key in messages):

- keys a rank wrote and a peer or the kernel waits for (host identities, fingerprint slots,
  beacons, arrivals, endpoints, requests for input, stacks): the reader asks the writer to post
  again (`repost`), and the writer's re-post thread does, from what it keeps;
- keys the kernel writes (`kept_by_kernel`: the cell's note, aborts, answers, the visual
  debugger's file name, stack requests): the kernel posts them again while they may be read,
  and a reader waits for its copy;
- keys written once by code distnb does not own (the process group's rendezvous) or read once
  (the visual debugger's relay): the reader fails at once, naming the key's role.

An attached job (`python -m distnb.run`) has a store of its own, hosted by its launcher, under
the run id's prefix; its ranks' agents (`distnb.rank.agent`) and the notebook use:

- `agent/rank/<rank>` [an `AgentInfo`: host, pid, local rank, world size]: each rank's agent,
  at start (the records of `distnb.records.agent`, as JSON);
- `agent/calls/<rank>` [a counter], `agent/req/<rank>/<n>` [an `AgentRequest`],
  `agent/rep/<rank>/<n>` [a `Reply`]: the notebook numbers a request to a rank's agent, posts
  it and reads the reply;
- `agent/out/<rank>/<k>` [text]: what a stopped rank's debugger printed, piece by piece, and
  `agent/outcount/<rank>` [pieces, characters]: how much so far;
- `agent/result/<rank>/<n>` [a `Reply`]: a stopped rank's answer to the notebook's `Call` at
  its prompt `n`, about its frame (shapes, replica digests, overflow reports);
- `agent/lease` [a number]: the attached notebook counts it up every second; a stopped or held
  rank whose lease stops moving resumes on its own (a notebook that died leaves the job running);
- `debug/count/<rank>`, `debug/ask/<n>`, `debug/answer/<n>`: the debugger's prompts, as above.
"""

from __future__ import annotations

__all__ = [
    "AGENT_LEASE",
    "CELL_FILE",
    "RUN",
    "abort",
    "agent_calls",
    "agent_out",
    "agent_out_count",
    "agent_rank",
    "agent_reply",
    "agent_request",
    "agent_result",
    "answer",
    "ask",
    "ask_count",
    "ask_number",
    "beacon",
    "board",
    "dap",
    "decode_run",
    "encode_run",
    "endpoint",
    "group_arrival",
    "host",
    "kept_by_kernel",
    "owner",
    "process_group",
    "replicas",
    "repost",
    "role",
    "slot",
    "spill",
    "stack_reply",
    "stack_request",
]

_PG = "pg"
RUN = "cell"
_CHECK = "check"
_DEBUG = "debug"
CELL_FILE = f"{_DEBUG}/cell-file"


def encode_run(
    cell: int, run_id: int, check: bool, stdin: bool = True, everyone: bool = True
) -> str:
    """The value of `RUN`: the cell's number as the notebook shows it, the **run id** (unique
    within the session: one notebook cell may run several times through the Python API), whether
    the checked runtime is on for it, whether the kernel can ask the user for input (no
    frontend stdin: nbconvert, papermill, `allow_stdin=False`), and whether every rank runs it
    (not `--ranks`)."""
    return f"{cell} {run_id} {int(check)} {int(stdin)} {int(everyone)}"


def decode_run(value: bytes | str) -> tuple[int, int, bool, bool, bool]:
    text = value.decode() if isinstance(value, bytes) else value
    cell, run_id, check, stdin, everyone = text.split()
    return int(cell), int(run_id), check == "1", stdin == "1", everyone == "1"


def endpoint(rank: int) -> str:
    """Where `rank` listens for its process group (JSON: host, interface, address), posted
    before it joins (`distnb.session.joining`)."""
    return f"endpoint/{rank}"


def ask_count(rank: int) -> str:
    """How many times `rank` has asked for input (written by that rank alone: no counter a
    stranger on the network could break, see `distnb.contract.signed`)."""
    return f"{_DEBUG}/count/{rank}"


def ask_number(rank: int, k: int) -> int:
    """The number of `rank`'s `k`-th request for input: unique in the session."""
    return k << 20 | rank


def ask(n: int) -> str:
    return f"{_DEBUG}/ask/{n}"


def answer(n: int) -> str:
    return f"{_DEBUG}/answer/{n}"


def dap(channel: str, to: str, n: int) -> str:
    return f"{_DEBUG}/dap/{channel}/{to}/{n}"


def stack_request(rank: int, n: int) -> str:
    return f"stackreq/{rank}/{n}"


def stack_reply(rank: int, n: int) -> str:
    return f"stack/{rank}/{n}"


def beacon(rank: int) -> str:
    return f"{_CHECK}/beacon/{rank}"


def abort(run_id: int | None) -> str:
    return f"{_CHECK}/abort/{'none' if run_id is None else run_id}"


def mismatch(run_id: int | None) -> str:
    """The `Mismatch` a run's ranks raised (JSON), posted by each rank that raises it (the same
    record on every one), read by the kernel for the error it shows."""
    return f"{_CHECK}/mismatch/{'none' if run_id is None else run_id}"


def host(rank: int) -> str:
    return f"{_CHECK}/host/{rank}"


def board(generation: str, name: str) -> str:
    """Prefix of a store board's slots (groups that span hosts)."""
    return f"{_CHECK}/fp/{generation}/{name}"


def spill(generation: str, name: str) -> str:
    """Prefix of the slots that hold fingerprints too big for a shared-memory slot."""
    return f"{_CHECK}/big/{generation}/{name}"


def slot(prefix: str, ring: int, index: int) -> str:
    return f"{prefix}/{ring}/{index}"


def process_group(epoch: int) -> str:
    """Rendezvous prefix of the default group's `epoch`-th remake (0: the first group)."""
    return _PG if epoch == 0 else f"{_PG}/{epoch}"


def group_arrival(epoch: int, rank: int) -> str:
    return f"{_PG}-here/{epoch}/{rank}"


def replicas(name: str) -> str:
    """The prefix of a replica check's board (`name`: its topic and members, or a watch's)."""
    return f"replicas/{name}"


def repost(rank: int) -> str:
    """Where `rank` is asked to post a key again: the value is the key's name."""
    return f"repost/{rank}"


def kept_by_kernel(key: str) -> bool:
    """Whether the kernel posts `key` again while a reader may still need it
    (`distnb.session.control.ControlPlane.keep`): a reader that finds a forged value there
    waits for the kernel's copy instead of failing."""
    return key in (RUN, CELL_FILE) or key.startswith(_KERNEL_KEPT)


def owner(key: str) -> int | None:
    """The rank that writes `key`, where its name says (None: the kernel's keys, boards' slots,
    whose rings the board knows)."""
    parts = key.split("/")
    at = _OWNER_AT.get((parts[0], parts[1] if len(parts) > 1 else ""))
    if at is None:
        at = _OWNER_AT.get((parts[0], ""))
    if at is None or len(parts) <= at or not parts[at].isdigit():
        return None
    number = int(parts[at])
    return number & 0xFFFFF if parts[:2] == [_DEBUG, "ask"] else number  # see `ask_number`


# where the writer's rank is in a key's parts, by (first part, second part or "")
_OWNER_AT = {
    (_CHECK, "host"): 2,
    (_CHECK, "beacon"): 2,
    (_DEBUG, "count"): 2,
    (_DEBUG, "ask"): 2,
    ("endpoint", ""): 1,
    ("stack", ""): 1,
    (f"{_PG}-here", ""): 2,
}

_KERNEL_KEPT = (f"{_CHECK}/abort/", f"{_DEBUG}/answer/", "stackreq/")


def role(key: str) -> str:
    """What the value under `key` is, in words, for messages about that key."""
    parts = key.split("/")
    head, tail = parts[0], parts[1:]
    last = tail[-1] if tail else ""
    if key == RUN:
        return "the kernel's note of the cell to run (its number and run id)"
    if key == CELL_FILE:
        return "the visual debugger's file name for the cell"
    if head in (_PG, f"{_PG}-here"):
        if head == _PG:
            return f"the process group's rendezvous ({'/'.join(tail) or 'its first key'})"
        return f"rank {last}'s arrival at making the process group again"
    if head == _CHECK and len(tail) == 5 and tail[0] in ("fp", "big"):
        _, _, name, ring, _ = tail
        what = "fingerprint" if tail[0] == "fp" else "large fingerprint"
        return f"the {what} that member {ring} of {_board_words(name)} posted"
    words = _ROLES.get((head, tail[0] if tail else ""), "")
    if words:
        rank = int(last) & 0xFFFFF if last.isdigit() else last
        return words.format(rank=rank, rest="/".join(tail[1:]), owner=tail[1] if tail else "")
    return _ROLES_BY_HEAD.get(head, "a value of the session's control plane").format(
        owner=tail[0] if tail else "", rest="/".join(tail)
    )


_ROLES = {
    (_CHECK, "host"): "rank {rank}'s host identity",
    (_CHECK, "beacon"): "rank {rank}'s beacon (where it waits)",
    (_CHECK, "abort"): "the kernel's release of the ranks waiting in run {rank}",
    (_DEBUG, "count"): "rank {rank}'s count of requests for input",
    (_DEBUG, "ask"): "rank {rank}'s request for input",
    (_DEBUG, "answer"): "the kernel's answer to rank {rank}'s request for input",
    (_DEBUG, "dap"): "a piece of the visual debugger's connection ({rest})",
}
_ROLES_BY_HEAD = {
    "endpoint": "rank {owner}'s address for the process group",
    "stackreq": "the kernel's request for rank {owner}'s live stack",
    "stack": "rank {owner}'s live stack",
    "replicas": "a replica check's board ({rest})",
    "repost": "a request to rank {owner} to post a value again",
}


def _board_words(name: str) -> str:
    """`c-<group>`: a group's board; `p-<group>-<src>-<dst>-<tag>`: a point-to-point channel's."""
    kind, _, rest = name.partition("-")
    if kind == "p":
        return f"the point-to-point channel {rest}"
    return f"process group {rest}"


AGENT_LEASE = "agent/lease"


def agent_rank(rank: int) -> str:
    return f"agent/rank/{rank}"


def agent_calls(rank: int) -> str:
    return f"agent/calls/{rank}"


def agent_request(rank: int, n: int) -> str:
    return f"agent/req/{rank}/{n}"


def agent_reply(rank: int, n: int) -> str:
    return f"agent/rep/{rank}/{n}"


def agent_out(rank: int, k: int) -> str:
    return f"agent/out/{rank}/{k}"


def agent_out_count(rank: int) -> str:
    return f"agent/outcount/{rank}"


def agent_result(rank: int, n: int) -> str:
    return f"agent/result/{rank}/{n}"
