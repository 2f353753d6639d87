"""A hand-written loop through accelerate: prepared model, optimizer (an AcceleratedOptimizer
around the torch one) and DataLoader, `accelerator.backward`, gradient accumulation over
`--accumulate` micro-batches. Prints the truth: the optimizer steps that really happened."""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    torch.manual_seed(0)
    x = torch.randn(args.n, 32)
    data = DataLoader(TensorDataset(x, (x.sum(1) > 0).long()), batch_size=16)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    steps = 0
    for inputs, labels in data:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += accelerator.sync_gradients
    print(f"TRUTH steps={steps} micro_batches={len(data)}", flush=True)


if __name__ == "__main__":
    main()
