"""A loop over epochs of a DataLoader whose workers are not persistent: each epoch's iter()
starts its workers again, and draws its first indices from a sampler that takes 40 ms to shuffle
(as one over millions of samples does), so that the wait stands well above a loaded machine's
noise (prints the truth it knows: each epoch's first step, its iter() time, and its wait from
iter() to its first batch in hand)."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

EPOCHS, BATCHES = 3, 8
SHUFFLE_S = 0.04


class SlowShuffle(Sampler[int]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        time.sleep(SHUFFLE_S)  # iter() draws the first indices before it returns
        yield from torch.randperm(self.size).tolist()

    def __len__(self) -> int:
        return self.size


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16 * BATCHES, 32), torch.randint(0, 2, (16 * BATCHES,)))
    loader = DataLoader(data, batch_size=16, sampler=SlowShuffle(len(data)), num_workers=2, persistent_workers=False)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    iter_ms, first_ms, firsts, step = [], [], [], 0
    for _ in range(EPOCHS):
        start = time.perf_counter()
        batches = iter(loader)  # the workers start here
        iter_ms.append(1e3 * (time.perf_counter() - start))
        firsts.append(step)
        for x, y in batches:
            if len(first_ms) < len(firsts):  # the pass's first batch in hand: its wait since iter()
                first_ms.append(1e3 * (time.perf_counter() - start))
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
    print(
        f"TRUTH steps={step} firsts={','.join(map(str, firsts))} iter_ms={','.join(f'{t:.3f}' for t in iter_ms)}",
        f"first_ms={','.join(f'{t:.3f}' for t in first_ms)}",
    )


if __name__ == "__main__":
    main()
