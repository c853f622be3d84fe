"""Showing a view: its widget in a live Jupyter frontend, its static HTML and text as fallbacks.

One display bundle carries all three, so JupyterLab shows the widget, nbconvert and GitHub the
HTML (widget state is not saved with the notebook), and terminal IPython the text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class View(Protocol):
    def _repr_html_(self) -> str: ...
    def widget(self) -> Any: ...


def bundle(view: View, live: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"text/plain": repr(view), "text/html": view._repr_html_()}
    if live:
        widget_data = view.widget()._repr_mimebundle_()
        data.update({k: v for k, v in widget_data.items() if k != "text/plain"})
    return data


def in_kernel() -> bool:
    """True in a Jupyter kernel, where displays can be widgets and be updated in place."""
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def show(view: View) -> None:
    from IPython.display import display

    display(bundle(view, in_kernel()), raw=True)  # type: ignore[no-untyped-call]


def shown(run: Callable[[], Any]) -> Any:
    """Run a cell for a magic: its views shown after it, a mismatch's table before the error,
    a bad argument or session state as IPython's `UsageError` (one line, no traceback)."""
    from IPython.core.error import UsageError

    from distnb.errors import CollectiveMismatchError, ConfigError, SessionError
    from distnb.views.mismatch import MismatchView

    try:
        result = run()
    except (ConfigError, SessionError) as exc:
        raise UsageError(str(exc)) from None
    except CollectiveMismatchError as err:
        if err.mismatch is not None and in_kernel():  # a table too; the exception follows it
            from IPython.display import display

            display(MismatchView(err.mismatch))  # type: ignore[no-untyped-call]
        raise
    for view in result.views:
        show(view)
    return result
