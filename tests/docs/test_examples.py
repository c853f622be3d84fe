"""Every documented example prints what its page shows (`harness.docs`): the README's and the
guide's (docs/), run in a real IPython shell with a real session, compared line by line; and
every output a page quotes is either such an example or says it is an excerpt (```text)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from harness.docs import FENCE, PAGES, ROOT, drifts, examples


def _quoted_outputs(page: Path) -> list[int]:
    """Lines (1-based) of the bare ``` blocks on `page` that are no example's output."""
    lines = page.read_text().splitlines()
    outputs = {e.shown_at - 1 for e in examples(page)}
    found, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i].strip())
        if opened is None:
            i += 1
            continue
        if opened[1] == "" and i not in outputs:
            found.append(i + 1)
        i = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```") + 1
    return found


def test_every_quoted_output_is_an_example_or_an_excerpt() -> None:
    bare = [f"{p.relative_to(ROOT)}:{n}" for p in PAGES for n in _quoted_outputs(p)]
    assert not bare, (
        "these blocks show output with no example before them: put the code that prints it in "
        "a ```python block right above, or mark an excerpt ```text and say where it is from: "
        f"{bare}"
    )


@pytest.mark.cluster
@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if examples(p)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_examples_print_what_the_page_shows(page: Path, tmp_path: Path) -> None:
    drifted = drifts(page, tmp_path)
    said = [f"{e.where()} shows\n{e.shown}\nbut prints\n{printed}" for e, printed in drifted]
    assert not said, "\n\n".join(said) + "\n\n(python -m harness.docs --write PAGE rewrites them)"
    assert not psutil.Process().children(recursive=True)  # the examples' ranks are gone
