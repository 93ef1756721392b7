"""The command lines as a terminal shows them: help without reStructuredText markup, every positional explained,
a did-you-mean for a misspelt engine flag."""
from __future__ import annotations

import argparse
import importlib

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
def test_ascend_engine_help_has_no_markup_and_no_sentence_cut_at_an_abbreviation(command, capsys):
    with pytest.raises(SystemExit):
        engine_main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "``" not in text
    assert "e.g [" not in text and "i.e [" not in text  # a help line once ended at "e.g." of its docstring


def test_a_flags_help_goes_past_an_example():
    help_text = {action.dest: action.help for action in _engine_parser("convert")._actions}
    ckpt_step = next(text for dest, text in help_text.items() if text and "Megatron's --ckpt-step" in text)
    assert "e.g. 10 for iter_0000010" in ckpt_step


def test_a_misspelt_engine_flag_gets_a_suggestion(capsys):
    assert engine_main(["train", "--tensor-model-paralel-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized argument --tensor-model-paralel-size; did you mean --tensor-model-parallel-size?" in err
    assert "usage:" not in err  # not the whole usage of a command with hundreds of flags
    assert engine_main(["convert", "--load-dri=/x", "--save-dir", "/y"]) == 2
    assert "did you mean --load-dir?" in capsys.readouterr().err



def _engine_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return parser
