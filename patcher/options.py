"""Options that local and remote commands share; click only, like patcher/cli.py."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click


def diff_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option(
        "--color",
        type=click.Choice(["auto", "always", "never"]),
        default="auto",
        show_default=True,
        help="Colour the diff: auto = on a terminal, unless NO_COLOR is set.",
    )
    @click.option(
        "--no-pager",
        "no_pager",
        is_flag=True,
        help="On a terminal, print the diff even when it is longer than the screen "
        "(by default it goes through $PAGER, else `less -FRX`).",
    )
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper
