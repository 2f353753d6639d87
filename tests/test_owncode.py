"""dlscope's own files are never named as the user's (dlscope.contract.owncode): the one rule a
sync's line, an allocation site and a doctor trial's call site follow, tested on frames."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dlscope.contract import owncode
from dlscope.injob import change, gpuclock, hooks

PACKAGE = Path(owncode.__file__).parent.parent


def test_dlscopes_files_are_its_own_and_a_name_alike_is_not():
    assert owncode.is_dlscope_code(hooks.__file__) and owncode.is_machinery(hooks.__file__)
    assert owncode.is_dlscope_code(os.path.realpath(hooks.__file__))
    assert owncode.is_dlscope_code(str(PACKAGE / "train.py")) and not owncode.is_machinery(str(PACKAGE / "train.py"))
    assert not owncode.is_dlscope_code(str(PACKAGE) + "_experiments/train.py")  # a sibling named alike
    assert not owncode.is_dlscope_code("train.py")
    # the data it ships is the built-in job's dataset, not its code
    assert not owncode.is_dlscope_code(str(PACKAGE / "data" / "mnist" / "train-images-idx3-ubyte.gz"))


def test_a_sync_in_dlscopes_wrapper_is_charged_to_the_scripts_line():
    frames = [
        (hooks.__file__, 10, "wrapper"),
        ("/env/site-packages/torch/nn/modules/module.py", 20, "_call_impl"),
        ("/home/me/train.py", 30, "main"),
    ]
    assert gpuclock.script_frame(frames) == ("/home/me/train.py", 30, "main")
    assert gpuclock.script_frame(frames[:2]) is None


def test_a_call_site_is_never_generated_code_nor_dlscopes(monkeypatch):
    """The direct call site of a doctor trial's evidence skips frames of code compiled from a
    string (before, their "<string>" name made absolute passed for a file) and dlscope's."""
    namespace: dict = {"call_sites": lambda: change.call_sites()}
    exec(compile("def built():\n    return call_sites()\n", "<generated>", "exec"), namespace)
    _, direct = namespace["built"]()
    assert direct is not None and direct[0] == os.path.abspath(__file__)
    # nor the script's own line when the script is `python -c` (its directory: the working one)
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.chdir(Path(__file__).parent)
    mine, direct = namespace["built"]()
    assert mine is not None and mine[0] == os.path.abspath(__file__) and direct == mine
