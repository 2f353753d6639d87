"""A custom loop with no DataLoader: batches sliced from np.memmap files, SGD with momentum,
a checkpoint every `--save-every` steps. `--prepare DIR` first writes the memmaps from MNIST."""

import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import dlscope


def prepare(directory, n):
    mnist = dlscope.load_mnist()
    images = np.lib.format.open_memmap(os.path.join(directory, "images.npy"), "w+", np.uint8, (n, 28, 28))
    images[:] = mnist.train_images[:n].numpy()
    images.flush()
    np.save(os.path.join(directory, "labels.npy"), mnist.train_labels[:n].numpy())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    prepare(args.directory, args.n)
    images = np.load(os.path.join(args.directory, "images.npy"), mmap_mode="r")
    labels = np.load(os.path.join(args.directory, "labels.npy"), mmap_mode="r")
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        index = np.sort(rng.choice(len(images), args.batch_size, replace=False))
        x = torch.from_numpy(images[index].astype(np.float32) / 255.0)
        y = torch.from_numpy(labels[index].astype(np.int64))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % args.save_every == 0:
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(args.directory, "ckpt.pt"))
    state = torch.load(os.path.join(args.directory, "ckpt.pt"))
    print(f"done: {args.steps} steps, last checkpoint at step {state['step']}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
