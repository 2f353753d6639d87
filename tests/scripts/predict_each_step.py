"""A loop that predicts on held-out samples under `torch.no_grad()` after each optimizer step,
its model left in train mode (no `eval()` call), its batches from a DataLoader. Prints the truth it
knows: its steps, its predictions and their time on its own clock."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS, BATCHES = 2, 10


def main() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(64 * BATCHES, 256), torch.randint(0, 10, (64 * BATCHES,))
    train = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    held_out = torch.randn(4096, 256)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Dropout(0.1), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, predictions, predict_s = 0, 0, 0.0
    for _ in range(EPOCHS):
        for inputs, targets in train:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            start = time.perf_counter()
            with torch.no_grad():
                predicted = model(held_out).argmax(1)
            predictions += 1
            predict_s += time.perf_counter() - start
            assert len(predicted) == len(held_out)
    print(f"TRUTH steps={steps} predictions={predictions} predict_ms={1e3 * predict_s:.3f}")


if __name__ == "__main__":
    main()
