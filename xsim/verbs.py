"""What every verb's parser shares: examples in an epilog, defaults shown, errors in the verb's own usage."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


class HelpFormatter(argparse.HelpFormatter):
    """Wraps the description as usual, but prints the examples epilog line by line, as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def add_verb(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    help: str,
    description: str | None = None,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """A sub-command parser whose --help ends with runnable examples; its errors print its own usage."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None
    p = subparsers.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=epilog,
        formatter_class=HelpFormatter,
    )
    p.set_defaults(verb_parser=p)
    return p


def lazy_help(template: str, module: str, attr: str) -> type[argparse.Action]:
    """A store action whose help is `template` formatted with `module.attr`, imported only when --help
    is printed (e.g. the topology grammar, which lives beside networkx)."""

    class LazyHelpStore(argparse._StoreAction):
        @property
        def help(self) -> str:
            import importlib

            return template.format(getattr(importlib.import_module(module), attr))

        @help.setter
        def help(self, value: str | None) -> None:
            pass

    return LazyHelpStore
