"""The wire to an attached job's agents: every request and answer round-trips (pure)."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from distnb.records import agent
from distnb.records.agent import (
    PROMPT_MARK,
    AgentInfo,
    AgentRequest,
    Break,
    Call,
    Detach,
    Digests,
    Events,
    Execute,
    FrameQuery,
    Hold,
    Listen,
    Listening,
    Panel,
    Profile,
    ProfileReport,
    PromptAnswer,
    Pull,
    Push,
    Recorded,
    RelayTo,
    Release,
    Reply,
    Shapes,
    Status,
    Stop,
    StopAt,
    Taped,
    Watch,
    WatchReport,
    answer_line,
    dumps_reply,
    dumps_request,
    loads_reply,
    loads_request,
    read_answer,
)
from distnb.records.collective import CallSite, CollectiveEvent, Fingerprint, TensorSpec
from distnb.records.overflow import Phase, WatchOptions
from distnb.records.profiling import Profiled, RankProfile, Span, SpanKind

REQUESTS: list[AgentRequest] = [
    Status(),
    Events(),
    Events(last=7),
    Events(last=1000, after=40),
    Stop(),
    Stop(StopAt.STEP),
    Hold(),
    Release(),
    Break("train.py", 52),
    Break("/abs/train.py", 3, cond="step > 2", check=True),
    Detach(),
    Profile(),
    Profile(steps=20),
    ProfileReport(),
    ProfileReport(end=True),
]
QUERIES: list[FrameQuery] = [
    Shapes(),
    Shapes(("model", "x"), include_all=True),
    Digests(("model", "opt"), grads=True, buffers=True),
    Watch("model", WatchOptions(frames=3, phases=(Phase.GRAD,), abort_after=4)),
    WatchReport(),
    Listen(),
    RelayTo("1-abcd"),
    Pull("model.weight", 2**26),
    Push(("lr", "note"), ("gASVCAAAAAAAAABHP7mZmZmZmZou", "gASVBQAAAAAAAACMAmhplC4=")),
]
ANSWERS: list[PromptAnswer] = [
    Execute("x = 1\nprint(x);; y"),
    Panel(),
    Detach(),
    *(Call(q, reply=9) for q in QUERIES),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=repr)
def test_every_request_round_trips_through_strict_json(request_: AgentRequest) -> None:
    text = dumps_request(request_)
    assert json.loads(text)["kind"] == request_.kind
    assert loads_request(text) == request_
    assert loads_request(text.encode()) == request_  # as the store gives it back


def test_a_profile_comes_back_whole_through_strict_json() -> None:
    spans = (
        Span("nn.Module: Linear", SpanKind.MODULE, 10, 20, thread=3),
        Span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", SpanKind.DATA, 0, 9),
    )
    profile = RankProfile(1, spans, ((0, 30),), steps_limit=5, clock_precision_ns=7, cost_ns=9)
    for found in (Profiled(asked=True, steps=5, limit=5, profile=profile), Profiled(False)):
        text = json.dumps(found.to_dict(), allow_nan=False)
        assert Profiled.from_dict(json.loads(text)) == found


@pytest.mark.parametrize("answer", ANSWERS, ids=repr)
def test_every_prompt_answer_round_trips_as_one_marked_line(answer: PromptAnswer) -> None:
    line = answer_line(answer)
    assert line.startswith(PROMPT_MARK) and "\n" not in line
    assert read_answer(line) == answer


def test_every_kind_is_in_its_union_once() -> None:
    for union, made in ((AgentRequest, REQUESTS), (PromptAnswer, ANSWERS), (FrameQuery, QUERIES)):
        kinds = [cls.kind for cls in get_args(union)]
        assert len(kinds) == len(set(kinds))
        assert {type(r) for r in made} == set(get_args(union))  # each kind tested


def test_a_line_the_user_typed_is_no_answer() -> None:
    for line in ("p x", "c", "", "!x = 1;; p x", ' {"kind": "detach"}'):
        assert read_answer(line) is None


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ('{"kind": "launch"}', "unknown agent request 'launch': expected one of break, detach"),
        ('{"op": "stop"}', "unknown agent request None"),
        ("not json", "an agent request is not JSON"),
        ("[1, 2]", "an agent request is a JSON object, not list"),
        ('{"kind": "stop", "at": "epoch"}', "Stop.at: 'epoch' is not a valid StopAt"),
        ('{"kind": "break", "file": "train.py"}', "Break needs 'line'"),
    ],
)
def test_a_bad_request_is_refused_with_what_was_found(raw: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + said.replace("(", r"\(")):
        loads_request(raw)


def test_a_marked_line_of_no_known_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown prompt answer 'status'"):
        read_answer(PROMPT_MARK + '{"kind": "status"}')
    with pytest.raises(ValueError, match="unknown kind 'nope'"):
        read_answer(answer_line(Call(Listen(), 1)).replace('"listen"', '"nope"'))


@pytest.mark.parametrize(
    "reply",
    [Reply(), Reply({"a": [1, 2]}), Reply("train.py"), Reply(error="ValueError: no file")],
    ids=repr,
)
def test_replies_round_trip(reply: Reply) -> None:
    back = loads_reply(dumps_reply(reply))
    assert back == reply and back.ok is (reply.error is None)


def test_answer_records_round_trip() -> None:
    site = CallSite("train.py", 12, code="dist.all_reduce(x)")
    event = CollectiveEvent(1, "WORLD", 4, "all_reduce", 16, site, 10, 20, 30, group_size=2)
    fp = Fingerprint(1, "WORLD", 4, "all_reduce", inputs=(TensorSpec((4,), "float32"),))
    records: list[Any] = [
        Recorded(event, fp),
        Taped(12, 11, (Recorded(event, fp),)),
        Listening("127.0.0.1", 5678, ("/usr/lib/python3",)),
        AgentInfo("node1", 123, 0, 2, 1.5),
    ]
    for record in records:
        assert type(record).from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_the_record_module_imports_only_records() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(agent))
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in found if m.startswith("distnb")} <= {
        "distnb.records.codec",
        "distnb.records.collective",
        "distnb.records.overflow",
    }
