"""The command lines as a terminal shows them: help without reStructuredText markup, every positional explained,
a did-you-mean for a misspelt engine flag."""
from __future__ import annotations

import argparse
import pytest

from ascend_engine.cli import COMMANDS, main as engine_main
from ascend_train.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _subparsers(sub)


def test_ascend_train_help_has_no_markup_and_explains_every_positional():
    parser = build_parser()
    assert "``" not in parser.format_help() and "`" not in parser.format_help()
    for name, sub in _subparsers(parser):
        text = sub.format_help()
        assert "`" not in text and "(default: None)" not in text, name
        for action in sub._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"ascend-train {name}: positional {action.dest} has no help"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_ascend_engine_help_has_no_markup(command, capsys):
    with pytest.raises(SystemExit):
        engine_main([command, "--help"])
    assert "``" not in capsys.readouterr().out


def test_a_misspelt_engine_flag_gets_a_suggestion(capsys):
    assert engine_main(["train", "--tensor-model-paralel-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized argument --tensor-model-paralel-size; did you mean --tensor-model-parallel-size?" in err
    assert "usage:" not in err  # not the whole usage of a command with hundreds of flags
    assert engine_main(["convert", "--load-dri=/x", "--save-dir", "/y"]) == 2
    assert "did you mean --load-dir?" in capsys.readouterr().err

