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


def show(view: View) -> None:
    from IPython import get_ipython
    from IPython.display import display

    live = getattr(get_ipython(), "kernel", None) is not None
    display(bundle(view, live), raw=True)  # type: ignore[no-untyped-call]
