"""A loop that validates after each epoch, as the PyTorch tutorials write it (`model.eval()`, then
the loader's pass under `torch.no_grad()`), from a DataLoader whose workers the pass starts inside
no_grad(): its dataset applies a transform that is a module, as torchvision's are (`Normalize`), so
each worker runs forwards with no grad. Its sampler takes 100 ms to shuffle, in the pass's iter(),
as one over millions of samples does; after the last evaluation the script does 300 ms of its own
work (a summary written). Prints the truth it knows: its evaluations, each one's time from
model.eval() to the pass's end, on its own clock."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

EPOCHS = 3
SHUFFLE_S = 0.1
SUMMARY_S = 0.3


class Normalize(nn.Module):
    """As torchvision's transforms.Normalize: a module, called per sample."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - 0.5) / 0.25


class Transformed(Dataset):
    def __init__(self, n: int) -> None:
        self.x, self.y, self.transform = torch.randn(n, 32), torch.randint(0, 2, (n,)), Normalize()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.x[i]), self.y[i]


class SlowShuffle(Sampler[int]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        time.sleep(SHUFFLE_S)  # iter() draws the first indices before it returns
        yield from torch.randperm(self.size).tolist()

    def __len__(self) -> int:
        return self.size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    train = DataLoader(TensorDataset(torch.randn(512, 32), torch.randint(0, 2, (512,))), batch_size=64, shuffle=True)
    data = Transformed(256)
    val = DataLoader(
        data,
        batch_size=64,
        sampler=SlowShuffle(len(data)),
        num_workers=args.workers,
        persistent_workers=args.persistent,
    )
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    eval_ms, steps = [], 0
    for _ in range(EPOCHS):
        model.train()
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        start = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val:
                correct += int((model(x).argmax(1) == y).sum())
        eval_ms.append(1e3 * (time.perf_counter() - start))
        print(f"accuracy {correct / len(data):.3f}")
    time.sleep(SUMMARY_S)  # the script's own work after its last evaluation
    print(f"TRUTH steps={steps} evals={len(eval_ms)} eval_ms={','.join(f'{t:.3f}' for t in eval_ms)}")


if __name__ == "__main__":
    main()
