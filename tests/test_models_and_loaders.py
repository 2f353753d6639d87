"""Every model's output shape; both batch sources deliver each sample once, in a seeded order."""

from __future__ import annotations

import pytest
import torch

from dlscope.config import MODEL_NAMES
from dlscope.data.loaders import ResidentBatches, TorchLoaderBatches, normalise
from dlscope.errors import ConfigError
from dlscope.models import MODELS, build_model

EXPECTED_PARAMS = {"cnn": 28_938, "small": 12_570, "net": 1_199_882, "lenet": 61_706, "mlp": 407_050}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("batch", [1, 7])
def test_model_output_shape(name, batch):
    model = build_model(name)
    out = model(torch.randn(batch, 1, 28, 28))
    assert out.shape == (batch, 10)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name]


def test_config_names_exactly_the_zoo():
    # TrainConfig checks names without torch; a model added to the zoo must be nameable there
    assert tuple(MODELS) == MODEL_NAMES


def test_unknown_model_is_config_error():
    with pytest.raises(ConfigError, match="choose from cnn, small, net, lenet, mlp"):
        build_model("resnet")


def test_normalise_matches_mnist_statistics(mnist):
    x = normalise(mnist.train_images[:20000])
    assert x.shape == (20000, 1, 28, 28)
    assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02


def test_resident_batches_exactly_once_and_seeded(mnist):
    images, labels = mnist.train_images[:1000], mnist.train_labels[:1000]
    batches = ResidentBatches(images, labels, batch_size=64, seed=3)
    assert len(batches) == 16
    epoch0 = [y for _, y in batches]
    assert sum(len(y) for y in epoch0) == 1000
    assert torch.cat(epoch0).sort().values.equal(labels.sort().values)
    batches.set_epoch(1)
    epoch1 = torch.cat([y for _, y in batches])
    assert not epoch1.equal(torch.cat(epoch0))  # a new order each epoch
    again = ResidentBatches(images, labels, batch_size=64, seed=3)
    assert torch.cat([y for _, y in again]).equal(torch.cat(epoch0))  # same seed, same order


def test_torch_loader_gives_the_same_batches_as_resident(mnist):
    images, labels = mnist.train_images[:300], mnist.train_labels[:300]
    resident = ResidentBatches(images, labels, batch_size=50, seed=5)
    classic = TorchLoaderBatches(images, labels, batch_size=50, seed=5, workers=0)
    for (xa, ya), (xb, yb) in zip(resident, classic, strict=True):
        assert ya.equal(yb)
        assert torch.allclose(xa, xb)
