"""Tensors in JupyterLab's Variables panel, as users of tensors expect them.

debugpy shows a tensor by its repr and, expanded, by walking its attributes, tracebacks and all
(`tensor.H is only supported on matrices`). For a variable of a tensor type the relay asks the
stopped rank instead (`distnb.rank.debug.tensors`, evaluated in the stopped frame):

- the line: `float32[16, 3] cpu` and a preview (small tensors whole; big ones summarised: min,
  max, mean, NaN and Inf counts); JupyterLab's tree shows an expandable variable's type, not
  its value, so the type says it too (`Tensor float32[16, 3] cpu  min ...`);
- expanded: a clean list (shape, dtype, device, requires_grad, grad, the summary, the first
  values), asked for only when the user expands it. The list's reference is one of the relay's
  own (`LISTED` set in the rank's id): a `variables` request for it never reaches debugpy.
"""

from __future__ import annotations

import ast
import itertools
import json
from typing import Any

from distnb.session.debugger.dap import DapClient, DapError

__all__ = ["LISTED", "TENSORS", "Variables"]

Message = dict[str, Any]

TENSORS = {"Tensor", "Parameter", "DTensor", "FakeTensor", "FunctionalTensor"}
LISTED = 1 << 31  # in a rank's own id: a list the relay made, not one of debugpy's
_AT_RANK = "__import__('distnb.rank.debug.tensors', fromlist=['line'])"


class Variables:
    """The relay's tensor lines and lists, per rank (see the module's docstring)."""

    def __init__(self) -> None:
        self._lists: dict[tuple[int, int], tuple[int, str]] = {}  # -> (frame, expression)
        self._ids = itertools.count(1)

    def present(self, client: DapClient, rank: int, frame: int, variables: list[Message]) -> None:
        """Rewrite the tensors among `variables` (debugpy's, in `frame` of `rank`) in place."""
        for variable in variables:
            name = variable.get("evaluateName")
            if variable.get("type") not in TENSORS or not name:
                continue
            line = _evaluate(client, frame, f"{_AT_RANK}.line({name})")
            if not isinstance(line, str):
                continue
            variable["type"] = f"{variable['type']} {line}"
            variable["value"] = line
            ref = next(self._ids) | LISTED
            self._lists[(rank, ref)] = (frame, name)
            variable["variablesReference"] = ref

    def listed(self, client: DapClient, rank: int, ref: int) -> list[Message] | None:
        """The clean list of one of the relay's references; None for debugpy's own."""
        found = self._lists.get((rank, ref))
        if found is None:
            return None
        frame, name = found
        rows = _evaluate(client, frame, f"{_AT_RANK}.fields({name}, {name!r})")
        return [
            # no `type`: JupyterLab's tree shows a variable's type where there is one (even
            # an empty one), its value only where there is none
            {"name": key, "value": value, "evaluateName": expression, "variablesReference": 0}
            for key, value, expression in (rows if isinstance(rows, list) else [])
        ]

    def forget(self, rank: int) -> None:
        """The rank runs on: its frames, and the lists made in them, are gone."""
        self._lists = {key: v for key, v in self._lists.items() if key[0] != rank}


def _evaluate(client: DapClient, frame: int, expression: str) -> Any:
    """The JSON value a rank-side call returned (None if it failed)."""
    try:
        body = client.request(
            "evaluate", {"expression": expression, "frameId": frame, "context": "clipboard"}
        )
    except DapError:
        return None
    text = str(body.get("result", ""))
    for parse in (json.loads, lambda t: json.loads(ast.literal_eval(t))):
        try:
            return parse(text)
        except (ValueError, SyntaxError, TypeError):
            continue
    return None
