"""Options the commands share (local, remote, real); click only, like patcher/cli.py."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

Decorated = TypeVar("Decorated", bound=Callable[..., Any])


def choice_option(
    *decls: str, choices: Sequence[str], default: str, help: str | None = None
) -> Callable[[Decorated], Decorated]:
    """One word of a few, its default shown in the help."""
    return click.option(*decls, type=click.Choice(choices), default=default, show_default=True, help=help)


def diff_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @choice_option(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
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


def _together(*decorators: Callable[[Any], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One decorator for several: their options in the help in the order given."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


# apply's, diff's and revert's own options, the same for a local tree and for `dynspec remote`.
apply_options = _together(
    click.option("--check", is_flag=True, help="With --dry-run: exit 1 if changes are pending."),
    click.option(
        "--force", is_flag=True, help="Allow an unsupported version; rebuild hand-edited targets from the original."
    ),
    diff_options,
)
diff_command_options = _together(
    click.option("--check", is_flag=True, help="Exit 1 if changes are pending."),
    click.option(
        "--force", is_flag=True, help="Allow an unsupported version; diff hand-edited targets against the original."
    ),
    diff_options,
)
revert_force = click.option(
    "--force", is_flag=True, help="Restore the originals even over hand edits (the edits are lost)."
)
