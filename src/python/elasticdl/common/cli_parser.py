"""The command line's argument parser: errors become exceptions with one-line messages."""

from __future__ import annotations

import argparse

from elasticdl.common.spec_codec import SpecError


class StrictArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that raises :class:`SpecError` instead of exiting.

    The CLI turns the exception into ``elasticdl: error: ...`` and exit status 2. Unknown
    flags are errors with "did you mean" hints (the original ElasticDL silently ignored typos
    like ``--num_worker=4``), and abbreviations are disabled so that a truncated flag is
    reported instead of silently matched.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            message = _explain_unknown_arguments(self, message)
        raise SpecError(f"{message} (see '{self.prog} --help')")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # parse_known_args + explicit rejection gives one message for all unknown flags, with
        # hints, instead of argparse's bare list.
        namespace, extras = self.parse_known_args(args, namespace)
        # Sub-commands register themselves as `_parser` (see elasticdl.client.main) so the
        # message and the hints come from the sub-command that was used.
        target = getattr(namespace, "_parser", None) or self
        if hasattr(namespace, "_parser"):
            delattr(namespace, "_parser")
        if extras:
            target.error("unrecognized arguments: " + " ".join(extras))
        return namespace


def _explain_unknown_arguments(parser: argparse.ArgumentParser, message: str) -> str:
    import difflib  # only on errors: keeps `elasticdl --help` fast

    extras = message.split(":", 1)[1].split()
    known = [opt for action in parser._actions for opt in action.option_strings]
    hints = []
    for extra in extras:
        if not extra.startswith("-"):
            continue
        flag = extra.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        if close:
            hints.append(f"{flag} -> did you mean {close[0]}?")
    message = "unrecognized arguments: " + " ".join(extras)
    if hints:
        message += " (" + "; ".join(hints) + ")"
    return message
