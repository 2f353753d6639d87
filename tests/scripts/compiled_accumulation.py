"""torch.compile'd model, gradient accumulation over `--accumulate` micro-batches, GradScaler
(disabled on CPU, as a mixed-precision script written for GPUs runs here), a DataLoader."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dlscope


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    args = parser.parse_args()
    torch.manual_seed(0)
    mnist = dlscope.load_mnist()
    x = mnist.train_images[: args.n].float().div(255).unsqueeze(1)
    loader = DataLoader(TensorDataset(x, mnist.train_labels[: args.n]), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 26 * 26, 10))
    compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    optimizer.zero_grad()
    for i, (images, labels) in enumerate(loader):
        loss = F.cross_entropy(compiled(images), labels) / args.accumulate
        scaler.scale(loss).backward()
        if (i + 1) % args.accumulate == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    print(f"{len(loader)} micro-batches, {len(loader) // args.accumulate} optimizer steps")


if __name__ == "__main__":
    main()
