"""Help that reads like bcc's tools: a description line first, every default shown, and two or
three real examples last. The examples of every command are here, in one table, keyed by the
command's words after `dlscope` (tests/test_help.py parses each one with the real parser)."""

from __future__ import annotations

import argparse
import copy
from typing import Any

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "": [
        ("dlscope lab", "the whole lab on the embedded MNIST → runs/lab-<time>/report.html"),
        ("dlscope ckpt inspect model.safetensors", "what is inside a checkpoint, without running it"),
        ("dlscope trace -- python train.py", "a script's file I/O through the OS"),
    ],
    "lab": [
        ("dlscope lab", "every step, two epochs, one report"),
        ("dlscope lab --recipe fast --out runs/fast", "the least time to 99% test accuracy"),
        ("dlscope lab --steps environment,dataset,train,profile --epochs 1", "only these steps"),
    ],
    "train": [
        ("dlscope train --epochs 5 --optimizer sgd --lr 0.05", "train, with TensorBoard and a checkpoint per epoch"),
        ("dlscope train --resume runs/x/checkpoints/last.pt --epochs 4", "continue a run to epoch 4"),
        (
            "dlscope train --nproc-per-node 2 --ckpt-format dcp",
            "2 ranks under torchrun (DDP), checkpoints any world size resumes",
        ),
    ],
    "profile": [
        ("dlscope profile", "top-10 operators of 5 training steps of a fresh model"),
        ("dlscope profile --batch-size 1 --sort-by cpu_total", "batch 1, ordered by total CPU time"),
    ],
    "sweep": [
        ("dlscope sweep", "batch 1, 16, 64 on every device"),
        ("dlscope sweep --batch-sizes 1,8,64,256 --threads 1,2", "a larger grid on the CPU"),
    ],
    "ops": [
        ("dlscope ops conv", "one convolution four ways, against the GEMM peak"),
        ("dlscope ops memory --batch-sizes 16,128", "memory per layer at two batch sizes"),
    ],
    "ops conv": [
        ("dlscope ops conv", "cnn's second convolution on one image"),
        ("dlscope ops conv --shape 8,3,32,32 --filters 64,3,3 --padding 1", "a CIFAR-sized first layer"),
        ("dlscope ops conv --impl im2col,torch --loop-order-shape off", "skip the slow pure-Python loops"),
    ],
    "ops memory": [
        ("dlscope ops memory", "batch 16, 64 and 128, modelled and measured"),
        ("dlscope ops memory --model lenet --batch-sizes 1,256", "another model, two extremes"),
    ],
    "graph": [
        ("dlscope graph", "forward, autograd and compiled graphs (tens of seconds to compile)"),
        ("dlscope graph --no-compile", "forward and autograd graphs only, in seconds"),
    ],
    "trace": [
        ("dlscope trace -- python train.py", "the best tracer available here"),
        ("dlscope trace --backend strace --out runs/t -- python train.py --epochs 1", "strace, into runs/t"),
        ("dlscope trace --measure-overhead --repeats 5 -- python train.py", "and what tracing costs"),
    ],
    "run": [
        ("dlscope run -- python train.py", "what bounds the step and what to change, in one screen"),
        ("dlscope run --verbose --trace-io --out runs/mine -- python train.py", "every table, and the file I/O"),
        ("dlscope run -- torchrun --nproc-per-node 2 train.py", "every rank: comm, overlap, stragglers"),
    ],
    "merge": [
        ("dlscope merge host-a/runs/job host-b/runs/job --out runs/job", "one job's machines as one analysis"),
        ("dlscope merge runs/rack1 runs/rack2 --out runs/all", "earlier merges merged again"),
    ],
    "doctor": [
        ("dlscope doctor -- python train.py", "what to change, predicted then measured (2 minutes)"),
        ("dlscope doctor --budget 300 --out runs/doc -- python train.py", "more rounds, a tighter noise band"),
    ],
    "diff": [
        ("dlscope diff runs/before runs/after", "where step time went between two runs of `dlscope run`"),
        ("dlscope diff runs/before runs/after --json", "the same as JSON: every part's band, operators, I/O"),
    ],
    "stacks": [
        ("dlscope stacks runs/run-20261124-190000", "where every process of a running `dlscope run` is now"),
        ("dlscope stacks 4242", "a process and its children, from /proc (Python stacks under dlscope run)"),
        ("dlscope stacks runs/mine --json", "the whole capture: threads, system calls, stacks"),
    ],
    "attach": [
        ("dlscope attach runs/run-20261124-190000 --profile-steps 5", "the next 5 steps of every rank, top-10"),
        ("dlscope attach 4242 --profile-steps 20 --timeout 60", "one process; give up waiting after 60 s"),
        ("dlscope attach runs/mine --profile-steps 5 --json", "the windows as JSON"),
    ],
    "watch": [
        ("dlscope watch runs/run-20261124-190000", "live until the job ends (Ctrl-C: stop watching)"),
        ("dlscope watch 4242 --interval 5 --recent 1000", "slower refresh, figures over 1000 steps"),
        ("dlscope watch runs/mine --once", "one view, for scripts"),
    ],
    "report": [
        ("dlscope report runs/lab-20261123-021500", "re-render report.html and report.md"),
        ("dlscope report runs/x/results.json", "the same, naming the file"),
        ("dlscope report --full runs/x", "and print the whole report at the terminal's width"),
    ],
    "tensorboard": [
        ("dlscope tensorboard runs/lab-20261123-021500", "on http://127.0.0.1:6006"),
        ("dlscope tensorboard runs/x --port 6007", "another port"),
    ],
    "env": [
        ("dlscope env", "hardware and software, as the lab's report lists them"),
        ("dlscope env | tee env.txt", "keep a copy for the lab report"),
    ],
    "models": [
        ("dlscope models", "the zoo, with parameters and FLOPs per sample"),
        ("dlscope models | grep lenet", "one model's line"),
    ],
    "data": [
        ("dlscope data verify", "the embedded copy's checksums"),
        ("dlscope data fetch --mirror https://example.org/mnist/", "download a verified copy"),
    ],
    "data fetch": [
        ("dlscope data fetch --mirror https://example.org/mnist/", "into ~/.cache/dlscope"),
        ("dlscope data fetch --mirror https://example.org/mnist/ --dest /data", "into /data"),
    ],
    "data verify": [
        ("dlscope data verify", "the embedded copy"),
        ("dlscope data verify --data-dir ~/data", "a copy laid out like torchvision's MNIST/raw"),
    ],
    "ckpt": [
        ("dlscope ckpt inspect model.safetensors", "tensors, offsets and safety, without loading"),
        ("dlscope ckpt diff a.pt b.pt", "which tensors changed"),
    ],
    "ckpt verify": [
        ("dlscope ckpt verify runs/x/checkpoints/final.pt", "reload it and compare test predictions"),
        ("dlscope ckpt verify final.pt --data-dir ~/data", "against another copy of MNIST"),
    ],
    "ckpt inspect": [
        ("dlscope ckpt inspect runs/x/checkpoints/final.pt", "zip members, pickle globals, tensors"),
        ("dlscope ckpt inspect model.safetensors --stats", "and min/max/mean of every tensor"),
        ("dlscope ckpt inspect model.keras --json > anatomy.json", "everything, as JSON"),
    ],
    "ckpt diff": [
        ("dlscope ckpt diff runs/x/checkpoints/last.pt runs/x/checkpoints/final.pt", "exit 0: identical"),
        ("dlscope ckpt diff a.pt b.pt --json", "every difference, as JSON"),
    ],
    "ckpt scan": [
        ("dlscope ckpt scan ~/Downloads/model.pt", "would torch.load or pickle.load run code?"),
        ("dlscope ckpt scan ~/models --json > verdicts.json", "every file under a directory, as JSON"),
        ("dlscope ckpt scan model.pt --allow collections.Counter", "trust one more global"),
    ],
    "ckpt seed003": [
        ("dlscope ckpt seed003", "seed 003's Keras MLP, 5 epochs, .h5 and .keras dissected"),
        ("dlscope ckpt seed003 --epochs 1 --train-subset 5000", "a quick one"),
    ],
    "pipeline": [
        ("dlscope pipeline sweep", "seed 003's tables, with verdicts"),
        ("dlscope pipeline prepare --out /tmp/mnist-files --formats files,tfrecord", "write a dataset"),
    ],
    "pipeline prepare": [
        ("dlscope pipeline prepare --out /tmp/mnist-files", "MNIST as small files, TFRecord shards, an array"),
        ("dlscope pipeline prepare --out /tmp/syn --source synthetic --samples 100000", "synthetic samples"),
    ],
    "pipeline run": [
        ("dlscope pipeline run /tmp/mnist-files --format files", "one cold epoch of small files"),
        ("dlscope pipeline run /tmp/mnist-files --workers 2 --prefetch 4 --warm", "two workers, warm cache"),
    ],
    "pipeline sweep": [
        ("dlscope pipeline sweep", "every row of seed 003's tables"),
        ("dlscope pipeline sweep --samples 20000 --repeats 1 --remove-data", "a quick one that cleans up"),
    ],
}


WIDTH = 80  # help must read well in a default terminal


def examples_epilog(command: str) -> str | None:
    """`command`'s examples as bcc prints them: comments aligned to the right of the commands, or,
    where that would pass 80 columns, each comment on its own line above its command."""
    examples = EXAMPLES.get(command)
    if not examples:
        return None
    width = max(len(line) for line, _ in examples)
    lines = [f"    {line:<{width}}  # {what}" for line, what in examples]
    if max(map(len, lines)) > WIDTH:
        lines = [text for line, what in examples for text in (f"    # {what}", f"    {line}")]
    return "examples:\n" + "\n".join(lines)


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help (unless the help already says it, or there is none to
    show: None, on/off flags); descriptions wrapped, the examples epilog kept line for line."""

    @staticmethod
    def default_text(action: argparse.Action) -> str:
        default = action.default
        if not action.option_strings or default is argparse.SUPPRESS or isinstance(default, bool):
            return ""
        if default is None or (isinstance(default, str | list | tuple) and not default):  # nothing to show
            return ""
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"(default {shown.replace('%', '%%')})"

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self.default_text(action):  # argparse prints no help line without a help text
            action = copy.copy(action)
            action.help = self.default_text(action)
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        help = (action.help or "").strip()
        if "default" in help:
            return help
        return f"{help} {self.default_text(action)}".strip()

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return text
        return super()._fill_text(text, width, indent)


class Subcommands(argparse._SubParsersAction):
    """A subcommand's one-line help is also the description its own --help starts with."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if "help" in kwargs:  # a help string escapes % as %%; a description is printed as written
            kwargs.setdefault("description", kwargs["help"].replace("%%", "%"))
        return super().add_parser(name, **kwargs)
