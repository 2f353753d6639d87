"""A loop that fails where the argument says: inside the model's forward (a shape error), in a
DataLoader worker's `__getitem__` (a corrupt sample), or in `torch.load` (a missing file) at its
fourth step, or before its first (`start`)."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 40 and sys.argv[1] == "worker":
            raise ValueError(f"sample {i} is corrupt")
        return torch.full((4,), float(i))


model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if sys.argv[1] == "start":
    model.load_state_dict(torch.load(sys.argv[2]))  # LOAD AT START
for step, x in enumerate(DataLoader(Samples(), batch_size=8, num_workers=1 if sys.argv[1] == "worker" else 0)):
    if step == 3 and sys.argv[1] == "forward":
        x = x[:, :3]
    if step == 3 and sys.argv[1] == "load":
        model.load_state_dict(torch.load(sys.argv[2]))
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
