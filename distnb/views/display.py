"""Showing a view: its widget in a live Jupyter frontend, its static HTML and text as fallbacks.

One display bundle carries all three, so JupyterLab shows the widget, nbconvert and GitHub the
HTML (widget state is not saved with the notebook), and terminal IPython the text.
"""

from __future__ import annotations

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
