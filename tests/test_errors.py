from __future__ import annotations

import warnings

from distnb.errors import (
    CellInterrupted,
    ConfigError,
    RankError,
    SessionError,
    group_failures,
    warned_at_caller,
)
from distnb.ranklist import format_ranks
from distnb.records.cell import RankFailure


def test_format_ranks_collapses_runs() -> None:
    assert format_ranks([3]) == "rank 3"
    assert format_ranks([0, 1, 2, 5]) == "ranks 0-2,5"
    assert format_ranks([5, 0, 1]) == "ranks 0-1,5"


def test_identical_failures_collapse_and_tracebacks_are_capped() -> None:
    same = [RankFailure(r, "ValueError", "bad", "tb") for r in range(4)]
    other = [RankFailure(r, "KeyError", f"k{r}", f"tb{r}") for r in range(4, 10)]
    err = RankError("cell In[1] failed", [*other, *same])
    assert next(ranks for ranks, _ in group_failures(err.failures)) == [0, 1, 2, 3]
    text = "\n".join(err._render_traceback_())
    assert "[ranks 0-3] ValueError: bad" in text
    assert text.count("tb") == 4  # four full tracebacks, the rest as one-liners
    assert "[rank 9] KeyError: k9" in text
    assert "... 3 more: see err.failures" in text
    assert len(err.failures) == 10


def test_a_rank_error_whose_traceback_is_its_message_is_shown_once() -> None:
    quit_ = RankFailure(1, "DebuggerQuit", "rank 1 quit the debugger at cell In[8] line 5", "")
    quit_ = RankFailure(1, quit_.ename, quit_.evalue, f"\x1b[31m{quit_.summary}\x1b[39m\n")
    tb = (
        "Traceback (most recent call last)\nCell In[8], line 5\nZeroDivisionError: division by zero"
    )
    zero = RankFailure(0, "ZeroDivisionError", "division by zero", tb)
    lines = RankError("cell In[8] failed", [quit_, zero])._render_traceback_()
    assert sum("quit the debugger" in line for line in lines) == 1
    assert lines[-2:] == [
        "",
        "[rank 1] DebuggerQuit: rank 1 quit the debugger at cell In[8] line 5",
    ]
    assert "Cell In[8], line 5" in lines


def test_kernel_side_errors_render_as_their_message_without_frames() -> None:
    def raised(exc: BaseException) -> list[str]:
        try:
            raise exc
        except BaseException as caught:
            assert caught.__traceback__ is not None  # frames there were, none rendered
            return caught._render_traceback_()  # type: ignore[attr-defined,no-any-return]

    where = "cell In[6] interrupted: rank 1 at cell In[6] line 6: time.sleep(30)"
    assert raised(CellInterrupted(where)) == [f"KeyboardInterrupt: {where}"]
    assert isinstance(CellInterrupted(where), KeyboardInterrupt)
    assert not isinstance(CellInterrupted(where), Exception)  # `except Exception` lets it pass
    message = "no cluster is running: start one with %dist_start (or distnb.start())"
    assert raised(SessionError(message)) == [f"SessionError: {message}"]
    assert raised(ConfigError("ranks [5] are not in this session")) == [
        "ConfigError: ranks [5] are not in this session"
    ]


def test_rank_tracebacks_keep_their_colours_only_where_the_shell_shows_colours() -> None:
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()  # the one IPython of this process
    coloured = "\x1b[31mZeroDivisionError\x1b[39m: division by zero\nCell In[8], line 5"
    err = RankError("cell In[8] failed", [RankFailure(0, "ZeroDivisionError", "x", coloured)])
    before = shell.colors
    try:
        shell.run_line_magic("colors", "nocolor")  # as `ipython --colors=NoColor`
        assert not any("\x1b[" in line for line in err._render_traceback_())
        shell.run_line_magic("colors", "linux")
        assert any("\x1b[31m" in line for line in err._render_traceback_())
    finally:
        shell.run_line_magic("colors", before)


def test_a_warning_from_a_wrapped_torch_function_is_shown_where_the_user_called_it() -> None:
    """torch warns at its caller (`stacklevel=2`); under distnb's wrapper that caller is
    distnb's, so the warning is shown at the first frame outside distnb: here, this test."""

    def deprecated() -> int:
        warnings.warn("old", FutureWarning, stacklevel=2)  # the caller: warned_at_caller
        return 7

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warned_at_caller(deprecated) == 7
    [shown] = caught
    assert (shown.filename, shown.category, str(shown.message)) == (
        __file__,
        FutureWarning,
        "old",
    )
