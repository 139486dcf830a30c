"""One-line summaries for the command lists of `sluice --help` and `sluice job --help`.

Typer lists each command with the whole first paragraph of its docstring and, in its rich
mode, keeps the docstring's line breaks there: a paragraph wrapped at 100 columns in the
source came out as ragged lines of one or two words in an 80-column table. A command's own
`--help` page still shows its whole docstring; the list shows its first sentence, on one line.
"""

from __future__ import annotations

import inspect
import re

import typer

LONG_SENTENCE = 160
"""A first sentence longer than this (characters) is cut at its first colon or semicolon
that comes after MIN_CLAUSE characters: the list wants the gist, the command's page has the rest."""

MIN_CLAUSE = 30
"""A clause shorter than this (characters) is too short to stand for the command alone."""

_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!\bvs)\.(\s|$)")
_CLAUSE_END = re.compile(r"[:;]\s")


def summary(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    paragraph = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    end = _SENTENCE_END.search(paragraph)
    sentence = paragraph[: end.start() + 1] if end else paragraph
    if len(sentence) > LONG_SENTENCE:
        for clause in _CLAUSE_END.finditer(sentence):
            if clause.start() >= MIN_CLAUSE:
                return sentence[: clause.start()].rstrip(" ,") + "."
    return sentence


def add_summaries(app: typer.Typer) -> None:
    """Give every command and sub-app of `app`, and theirs, without a short help its summary."""
    for command in app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        if command.short_help is None and doc:
            command.short_help = summary(doc)
    for group in app.registered_groups:
        if group.typer_instance is None:
            continue
        info = group.typer_instance.info  # typer keeps unset fields as placeholders, not None
        if isinstance(info.help, str) and info.help and not isinstance(info.short_help, str):
            info.short_help = summary(info.help)
        add_summaries(group.typer_instance)
