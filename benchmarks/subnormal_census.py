"""Subnormal floats on this CPU, and what a census of a step costs (injob/subnormals.py).

penalty  a 512×512 float32 matmul, one thread: normal inputs, one input subnormal (×1e-39),
         and the same after torch.set_flush_denormal(True) (the subnormal input then made anew:
         zeros); a multiply of 2^20 values whose outputs are subnormal against one whose are not
         (not exp, which slows past its underflow bound even with flush-to-zero)
census   a training step (forward, backward, SGD step) bare and under the census's dispatch
         mode, interleaved round by round, on two models: the test script's MLP (256→256→10,
         batch 256) and a word-level LSTM language model (vocabulary 10,000, 100-wide embedding
         and LSTM, batch 20 × 35 tokens, as pytorch/examples' word_language_model with
         --emsize 100 --nhid 100): ms a step, median of the rounds

  .venv/bin/python benchmarks/subnormal_census.py [--rounds 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from dlscope.injob.subnormals import census_mode


def ms(call: Callable[[], object], repeats: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e3


def penalty() -> None:
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    x = torch.randn(1 << 20)
    rows = [
        ("matmul, normal inputs", ms(lambda: a @ b, 20)),
        ("matmul, one input subnormal", ms(lambda: (a * 1e-39) @ b, 3)),
        ("multiply, normal outputs", ms(lambda: x * 1e-3, 20)),
        ("multiply, subnormal outputs", ms(lambda: x * 1e-39, 5)),
    ]
    torch.set_flush_denormal(True)
    rows.append(("matmul, one input ×1e-39 with flush-to-zero", ms(lambda: (a * 1e-39) @ b, 20)))
    rows.append(("multiply, subnormal outputs with flush-to-zero", ms(lambda: x * 1e-39, 20)))
    torch.set_flush_denormal(False)
    for name, value in rows:
        print(f"  {name:46} {value:9.2f} ms")


class LanguageModel(nn.Module):
    def __init__(self, vocabulary: int = 10_000, width: int = 100) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.lstm = nn.LSTM(width, width, 2)
        self.out = nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(self.embed(tokens))[0])


def steps() -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 10))
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    lm = LanguageModel()
    tokens, targets = torch.randint(0, 10_000, (35, 20)), torch.randint(0, 10_000, (35 * 20,))

    def step(model: nn.Module, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

        def run() -> None:
            optimizer.zero_grad()
            loss().backward()
            optimizer.step()

        return run

    return {
        "MLP 256→256→10, batch 256": step(mlp, lambda: nn.functional.cross_entropy(mlp(x), y)),
        "LSTM language model, 20×35 tokens": step(
            lm, lambda: nn.functional.cross_entropy(lm(tokens).view(-1, 10_000), targets)
        ),
    }


def census_cost(rounds: int) -> None:
    for name, run in steps().items():
        bare, counted = [], []
        for r in range(rounds):
            for mode in ("bare", "census") if r % 2 else ("census", "bare"):
                if mode == "bare":
                    bare.append(ms(run, 5))
                    continue
                census = census_mode(torch)
                with census:
                    counted.append(ms(run, 5))
        b, c = statistics.median(bare), statistics.median(counted)
        print(f"  {name:34} bare {b:8.2f} ms   census {c:8.2f} ms   ×{c / b:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"penalty ({args.threads} thread)")
    penalty()
    print(f"a step bare and under the census (median of {args.rounds} rounds of 5 steps)")
    census_cost(args.rounds)


if __name__ == "__main__":
    main()
