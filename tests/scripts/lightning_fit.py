"""A small LightningModule fitted the usual way: synthetic data, a validation loop (with Lightning's
sanity check), ModelCheckpoint every epoch; `--devices 2` under torchrun is DDP on gloo. Each rank
prints the truth Lightning itself knows."""

import argparse
import os

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Truth(Callback):
    def __init__(self) -> None:
        self.evaluations = self.saves = 0

    def on_validation_start(self, trainer, pl_module) -> None:
        self.evaluations += 1  # the sanity check included: it is an evaluation run too

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saves += 1


def loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    return DataLoader(TensorDataset(x, (x.sum(1) > 0).long()), batch_size=16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    truth = Truth()
    checkpoints = ModelCheckpoint(dirpath=args.out, save_top_k=-1, every_n_epochs=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=DDPStrategy(process_group_backend="gloo") if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        num_sanity_val_steps=1,
        callbacks=[truth, checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
    )
    trainer.fit(Classifier(), loader(128, 0), loader(64, 1))
    files = sorted(os.path.join(args.out, f) for f in os.listdir(args.out) if f.endswith(".ckpt"))
    saves = truth.saves if trainer.is_global_zero else 0  # only rank 0 writes the files
    print(
        f"TRUTH rank={trainer.global_rank} steps={trainer.global_step} evaluations={truth.evaluations} "
        f"saves={saves} files={','.join(files) if saves else ''}",
        flush=True,
    )


if __name__ == "__main__":
    main()
