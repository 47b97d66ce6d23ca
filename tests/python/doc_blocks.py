"""The fenced blocks of the project's Markdown pages, as the README's and the docs'
tests read them: each block's language, text and line, whether a `<!-- not-run: why -->`
line marks it, and the ```text block that follows it (the output it shows)."""

import os
import re
from dataclasses import dataclass
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:(.*?)-->\s*$")


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: Optional[str]  # the reason given, or None
    output: Optional[str]  # the ```text block right after it (blank lines between), if any

    def __str__(self):
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list:
    """Every fenced block of `page` (a path relative to the repository)."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        text = f.read()
    found = []
    matches = list(_FENCE.finditer(text))
    for j, m in enumerate(matches):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.search(before)
        output = None
        if j + 1 < len(matches) and matches[j + 1].group(1) == "text" \
                and text[m.end():matches[j + 1].start()].strip() == "":
            output = matches[j + 1].group(2)
        found.append(Block(page, text[:m.start()].count("\n") + 1, m.group(1), m.group(2),
                           marker.group(1).strip() if marker else None, output))
    return found


def missing_lines(shown: str, printed: str) -> list:
    """The lines of `shown` (an output a page shows) that `printed` lacks, each compared
    without trailing spaces; a shown line "..." stands for lines left out."""
    printed_lines = {line.rstrip() for line in printed.splitlines()}
    return [line for line in shown.splitlines()
            if line.strip() and line.strip() != "..." and line.rstrip() not in printed_lines]


def sandbox(directory: str, build_dir: str) -> None:
    """`directory` set up to run a page's commands as from the repository root: its
    top-level folders linked in (`build` to `build_dir`), so that what the commands
    write lands in `directory`."""
    for name in os.listdir(REPO):
        if name.startswith(".") or name == "build" or not os.path.isdir(os.path.join(REPO, name)):
            continue
        os.symlink(os.path.join(REPO, name), os.path.join(directory, name))
    os.symlink(build_dir, os.path.join(directory, "build"))
