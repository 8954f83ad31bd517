"""`--help` of every command: every option explains itself and shows its default."""

from __future__ import annotations

import argparse
import re

import pytest

from multibranch.cli import HelpFormatter, all_parsers, build_parser, main


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_the_walk_reaches_every_command():
    names = {path for path, _ in all_parsers(build_parser())}
    assert {("translate",), ("evaluate",), ("train",), ("convert", "proximal"), ("convert", "export")} <= names


@pytest.mark.parametrize("path", [path for path, _ in all_parsers(build_parser()) if path], ids=" ".join)
def test_every_option_has_help(path):
    parser = dict(all_parsers(build_parser()))[path]
    missing = [action.option_strings[-1] for action in _options(parser) if not (action.help or "").strip()]
    assert missing == []


def test_every_convert_subcommand_has_help():
    convert = dict(all_parsers(build_parser()))[("convert",)]
    sub = next(a for a in convert._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(helps) == set(sub.choices) and all(h and h.strip() for h in helps.values())


def test_every_parser_shows_defaults():
    for path, parser in all_parsers(build_parser()):
        assert parser.formatter_class is HelpFormatter, path


@pytest.mark.parametrize("command", [["translate"], ["evaluate"], ["convert", "proximal"], ["prepare"]])
def test_help_text_shows_defaults(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "(default: " in text
    if command == ["translate"]:
        assert "(default: auto)" in text and "SCORE<TAB>LOGPROB<TAB>TOKENS" in text
    if command == ["prepare"]:
        assert "(default: 8000)" in text and text.count("(default: 8000)") == 1


def _entries(help_text: str) -> list[str]:
    """The option and positional entries of one `--help` text, each as one line of words."""
    entries: list[str] = []
    for line in help_text.splitlines():
        if line.startswith("  ") and not line.startswith("    ") and line.strip():
            entries.append(line.strip())
        elif line.startswith("    ") and entries:
            entries[-1] += " " + line.strip()
        elif not line.strip() or not line.startswith(" "):
            entries.append("")  # a heading or a blank line ends the entry
    return [entry for entry in entries if entry]


def test_no_help_prints_a_default_twice(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    twice = []
    for path, parser in all_parsers(build_parser()):
        for entry in _entries(parser.format_help()):
            if len(re.findall(r"\bdefault\b", entry, flags=re.IGNORECASE)) > 1:
                twice.append(f"{' '.join(path)}: {entry}")
    assert twice == []


def test_no_help_cites_a_document_the_user_does_not_have():
    cited = [" ".join(path) for path, parser in all_parsers(build_parser())
             if "SEEDS-SPEC" in parser.format_help() or "§" in parser.format_help()]
    assert cited == []
