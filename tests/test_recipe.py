"""`--recipe fast`: the fast model computes what the cnn computes, and the recipe reaches 99%."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlscope.cli import build_parser
from dlscope.cli.common import train_config
from dlscope.errors import ConfigError
from dlscope.models import FastCNN, SeedCNN
from dlscope.train import RECIPES, StopAtAccuracy, TrainConfig, Trainer


def test_fast_cnn_is_the_cnn_in_another_layout(mnist):
    from dlscope.data.loaders import normalise

    torch.manual_seed(0)
    cnn, fast = SeedCNN(), FastCNN()
    fast.load_state_dict(cnn.state_dict())
    x, y = normalise(mnist.train_images[:32]), mnist.train_labels[:32]
    out_cnn, out_fast = cnn(x), fast(x)
    torch.testing.assert_close(out_fast, out_cnn, rtol=1e-4, atol=1e-5)
    F.cross_entropy(out_cnn, y).backward()
    F.cross_entropy(out_fast, y).backward()
    for (name, p), q in zip(cnn.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert fast.conv1[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_recipe_replaces_defaults_but_explicit_settings_win():
    fast = TrainConfig.from_recipe("fast")
    assert fast.model == RECIPES["fast"]["model"] == "fastcnn"
    assert TrainConfig.from_recipe("fast", batch_size=64).batch_size == 64
    assert TrainConfig.from_recipe("default") == TrainConfig()
    with pytest.raises(ConfigError, match="unknown recipe"):
        TrainConfig.from_recipe("fastest")


def test_cli_accepts_recipe_wherever_training_args_are():
    for command in ("train", "lab", "profile"):
        args = build_parser().parse_args([command, "--recipe", "fast", "--seed", "3"])
        config = train_config(args)
        assert config.model == "fastcnn" and config.seed == 3


@pytest.mark.slow
def test_fast_recipe_reaches_99_percent(mnist):
    torch.set_num_threads(2)
    config = TrainConfig.from_recipe("fast", seed=1, target_acc=99.0)
    result = Trainer(config, mnist, [StopAtAccuracy(99.0)]).fit()
    assert result.target_reached_epoch is not None, [e.test_acc for e in result.epochs]
    assert result.final.test_acc >= 99.0
