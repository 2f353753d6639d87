"""Errors name the path the user gave, not a parent or a file inside it."""

from __future__ import annotations

import pytest

from dlscope.cli import main


@pytest.mark.parametrize("command", ["report", "tensorboard"])
def test_a_missing_run_is_named_as_given(tmp_path, capsys, command):
    for missing in ("/nonexistent", str(tmp_path / "nope" / "run1")):
        assert main([command, missing]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dlscope: error: {missing}: ") and "no such run directory" in err, err


def test_a_directory_without_results_is_named_as_given(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    # the path as given (not a file inside it), and what is missing there; one line
    assert err.startswith(f"dlscope: error: {tmp_path}: ") and "no results.json" in err and "\n" not in err, err
