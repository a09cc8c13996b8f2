"""Command-line parsing whose mistakes read as one line.

argparse answers a typo with the whole usage text and a sentence about "arguments"; a user
who typed ``--batc 2`` or ``bnch`` wants the one thing that is wrong and the nearest thing
that is right.  :class:`OneLineParser` turns every parse error into a :class:`UsageError`
(one ``error:`` line, exit 2, as every other mistake the tool reports), naming the option
or value and, where one is close, what was probably meant.  ``--help`` still prints usage.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable

from ipu_stack.util.errors import UsageError

_INVALID_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)")
_INVALID_VALUE = re.compile(r"argument (\S+): invalid (\w+) value: '([^']*)'")
_UNRECOGNISED = re.compile(r"unrecognized arguments: (.*)")
_REQUIRED = re.compile(r"the following arguments are required: (.*)")
_KINDS = {"int": "a whole number", "float": "a number"}


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser that raises a one-line :class:`UsageError` instead of printing
    usage and exiting."""

    def options(self) -> list[str]:
        """Every long option this parser takes, read from its usage text."""
        return sorted(set(re.findall(r"--[a-z0-9][a-z0-9-]*", self.format_usage())))

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but a word left over is named by the subcommand it followed, so
        that its options can be suggested."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = getattr(self, "commands", {})
            parser = commands.get(getattr(parsed, "command", None), self)
            raise UsageError(parser.one_line("unrecognized arguments: " + " ".join(extras)))
        return parsed

    def add_global_flags(self, *flags: tuple[tuple[str, ...], str]) -> None:
        """The top-level flags (``--quiet``, ``--debug``) accepted after every subcommand
        too, nested ones included: each subcommand's parser takes them without a default of
        its own."""
        for parser in getattr(self, "commands", {}).values():
            for flag, help_text in flags:
                parser.add_argument(*flag, action="store_true", default=argparse.SUPPRESS,
                                    help=help_text)
            parser.add_global_flags(*flags)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(self.one_line(message))

    def one_line(self, message: str) -> str:
        """argparse's ``message`` said as this tool says its errors."""
        command = self.prog.removeprefix("ipu-stack").strip()
        where = f"{command}: " if command else ""
        if found := _INVALID_CHOICE.fullmatch(message):
            name, value, allowed = found.groups()
            choices = re.findall(r"'([^']*)'", allowed)
            what = "command" if name.endswith("command") else name
            return (f"{where}unknown {what} {value!r}{did_you_mean(value, choices)} "
                    f"(one of {', '.join(choices)})")
        if found := _INVALID_VALUE.fullmatch(message):
            name, kind, value = found.groups()
            return f"{where}{name} {value!r} is not {_KINDS.get(kind, kind)}"
        if found := _UNRECOGNISED.fullmatch(message):
            words = found.group(1).split()
            first = words[0]
            hint = did_you_mean(first, self.options()) if first.startswith("-") else ""
            return (f"{where}unrecognised {'option' if first.startswith('-') else 'argument'} "
                    f"{first!r}{hint}")
        if found := _REQUIRED.fullmatch(message):
            usage = " ".join(["ipu-stack", *command.split(), "--help"])
            missing = "a command" if found.group(1).endswith("_command") else found.group(1)
            return f"{where}missing {missing} (`{usage}` shows usage)"
        return f"{where}{message}"
