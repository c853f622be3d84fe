from __future__ import annotations

from distnb.errors import RankError, group_failures
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
