"""Section graph: the framework's life cycle (seed 004, 1.4.3) — forward graph, autograd graph with saved"""

from __future__ import annotations

import re
from typing import Any

from dlscope.report.blocks import Block, Code, Findings, Para, Svg, Table
from dlscope.report.graphs import graph_svg

CACHE_WORDS = {"cold": "cold: a fresh, empty Inductor cache", "warm": "warm allowed: the user's Inductor cache"}

TITLE = "Framework life cycle: forward graph, autograd graph, generated code"


def _svg(name: str, graph: dict, caption: str, rankdir: str = "TB") -> Svg:
    svg, how = graph_svg(graph, rankdir)
    return Svg(name, svg, f"{caption} (drawn by {how})")


def render(section: dict[str, Any]) -> list[Block]:
    forward, autograd = section["forward"], section["autograd"]
    saved_rows = [
        [node["name"], s["name"], "×".join(map(str, s["shape"])) or "scalar", s["dtype"], s["bytes"]]
        for node in autograd["nodes"]
        if node["kind"] == "backward"
        for s in node["saved"]
    ]
    blocks: list[Block] = [
        Para(
            f"How the framework runs {section['model']} (seed 004, 1.4.3), at batch {section['batch_size']} on "
            f"{section['device']}. (1) The Python program becomes a forward data-flow graph — here torch.fx's "
            f"symbolic trace, {len(forward['nodes'])} nodes with the shapes flowing along them."
        ),
        _svg("graph_forward", forward, "forward data-flow graph (torch.fx)"),
        Para(
            "(2) Automatic differentiation records a backward graph while the forward runs: walked from "
            f"loss.grad_fn, {autograd['backward_nodes']} nodes (pink: backward functions, green: AccumulateGrad "
            f"writing a parameter's .grad) and, dashed orange, the {autograd['saved_tensors']} tensors they saved "
            f"for backward — {autograd['saved_distinct_bytes'] / 2**20:.2f} MiB distinct (weights "
            "included; a ReLU output its pool saves again counted once): the activation memory of training."
        ),
        _svg("graph_autograd", autograd, "autograd graph from loss.grad_fn with saved tensors"),
        Table(["backward node", "saved", "shape", "dtype", "bytes"], saved_rows, "saved tensors per backward node"),
    ]
    compiled = section.get("compiled")
    if compiled is None:
        text = (
            "(3) Generated code and (4) its schedule come from torch.compile, which takes tens of seconds of "
            "C++ compilation on a small CPU; run `dlscope graph` (or `dlscope lab --compile`) to add the "
            "joint graph, Inductor's generated code and eager against compiled step time."
        )
        blocks.append(Para(text))
        return blocks
    steps = compiled["step_ms"]
    joint = compiled["joint_graph"]
    took = f"Compiling took {compiled['compile_seconds']:.1f} s ({CACHE_WORDS[compiled['cache']]})."
    step = (
        f"(4) Training step at batch {compiled['batch_size']}: eager {steps['eager']:.2f} ms, compiled "
        f"{steps['compiled']:.2f} ms — {compiled['speedup']:.2f}× (median of {compiled['repeats']}, interleaved; "
        "the optimizer step stays eager)."
    )
    blocks += [
        Para(
            "(3) torch.compile: TorchDynamo captures the forward, AOTAutograd traces forward and backward "
            f"together into one joint graph of {len(joint['nodes'])} aten/prims nodes, and Inductor fuses "
            f"them into {len(compiled['kernels'])} {compiled['generated_language']} kernels around library "
            "calls (convolutions and matmuls stay with oneDNN/BLAS on CPU)."
        ),
        Findings([("info", took), ("good" if compiled["speedup"] > 1 else "warn", step)]),
        _svg("graph_joint", joint, "AOTAutograd joint forward + backward graph"),
        Table(["generated kernel"], [[k] for k in compiled["kernels"]], "Inductor's fused kernels"),
    ]
    for kind, code in compiled["generated_code"].items():
        excerpts = code_excerpts(code)
        if "kernel" in excerpts:
            blocks.append(Para(f"One fused kernel Inductor generated for the {kind} pass, as it was compiled:"))
            blocks.append(Code(excerpts["kernel"], "cpp"))
        if "schedule" in excerpts:
            text = (
                f"The {kind} schedule (`call`): library calls (extern_kernels), fused kernels and buffer "
                f"frees in the order they run ({len(code.splitlines())} lines in all; the run's graph/ "
                "folder has the whole file):"
            )
            blocks.append(Para(text))
            blocks.append(Code(excerpts["schedule"], "python"))
    return blocks


KERNEL_SOURCE = re.compile(
    r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(.*?^'{3}.*?\)$", re.DOTALL | re.MULTILINE
)


def code_excerpts(code: str) -> dict[str, str]:
    """The two instructive parts of an Inductor output file: one fused kernel's source (an
    elementwise/pool fusion rather than a weight-layout copy when there is one), and `call`, the
    schedule that runs library calls, fused kernels and buffer frees in order."""
    excerpts = {}
    kernels = {m.group(1): m.group(0) for m in KERNEL_SOURCE.finditer(code)}
    if kernels:
        name = next((k for k in kernels if "relu" in k or "pool" in k), next(iter(kernels)))
        excerpts["kernel"] = kernels[name]
    lines = code.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def call(")), None)
    if start is not None:
        indent = len(lines[start]) - len(lines[start].lstrip())
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i][: indent + 1].isspace()),
            len(lines),
        )
        excerpts["schedule"] = "\n".join(line[indent:] for line in lines[start:end]).rstrip()
    return excerpts
