"""The command line of a generated documentation page: print it, or `--write` it over the committed file.

A test compares the committed file with the generator's output, so a generated page is never edited by hand.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def main(render: Callable[[], str], page: Path, description: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"write {page}")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        page.write_text(text)
        print(f"wrote {page}")
    else:
        print(text, end="")
    return 0
