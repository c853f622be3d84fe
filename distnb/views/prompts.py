"""Terminal IPython's prompt in auto mode: `[ranks 0-1] In [5]:`, so the prompt says where the
next cell runs. Continuation lines keep aligned under the longer prompt."""

from __future__ import annotations

from typing import Any

from IPython.terminal.prompts import Prompts
from pygments.token import Token

__all__ = ["RanksPrompts", "ranks_prompts"]


class RanksPrompts(Prompts):
    """The shell's own prompts (`inner`), with `[label] ` in front of the input prompt."""

    def __init__(self, shell: Any, inner: Prompts, label: str) -> None:
        super().__init__(shell)
        self.inner: Any = inner
        self.label = label

    def in_prompt_tokens(self) -> list[tuple[Any, str]]:
        return [(Token.Prompt, f"[{self.label}] "), *self.inner.in_prompt_tokens()]

    def continuation_prompt_tokens(
        self, width: int | None = None, *, lineno: int | None = None, wrap_count: int | None = None
    ) -> list[tuple[Any, str]]:
        if width is None:
            width = sum(len(text) for _, text in self.in_prompt_tokens())
        tokens: list[tuple[Any, str]] = self.inner.continuation_prompt_tokens(
            width, lineno=lineno, wrap_count=wrap_count
        )
        return tokens

    def rewrite_prompt_tokens(self) -> list[tuple[Any, str]]:
        tokens: list[tuple[Any, str]] = self.inner.rewrite_prompt_tokens()
        return tokens

    def out_prompt_tokens(self) -> list[tuple[Any, str]]:
        tokens: list[tuple[Any, str]] = self.inner.out_prompt_tokens()
        return tokens


def ranks_prompts(shell: Any, inner: Prompts, label: str) -> RanksPrompts:
    return RanksPrompts(shell, inner, label)
