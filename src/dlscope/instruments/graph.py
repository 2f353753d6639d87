"""The framework's life cycle, observed (seed 004, 1.4.3): Python → forward data-flow graph →
backward graph by automatic differentiation → generated code → a scheduled, timed step.

- forward graph: `torch.fx.symbolic_trace` of the model, shapes filled in by `ShapeProp`;
- autograd graph: walked from `loss.grad_fn` through `next_functions`, with each node's saved
  tensors (its `_saved_*` attributes: what backward needs, and why activations cost memory);
- joint graph and generated code: `torch.compile` (AOTAutograd traces forward and backward into
  one graph of aten ops; Inductor writes C++ on CPU, Triton on GPU), captured from torch's own
  logging artifacts `aot_joint_graph` and `output_code`;
- eager against compiled training-step time (compiled forward + backward; optimizer step eager).

Every graph is a JSON-able {"nodes", "edges"} dict; dlscope.report.graphs draws it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from dlscope.measure.timing import Contender, time_interleaved
from dlscope.train import train_step

DTYPE_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int64: "i64", torch.bool: "b8"}


def shape_text(t: torch.Tensor | torch.Size) -> str:
    shape = t.shape if isinstance(t, torch.Tensor) else t
    return "×".join(map(str, shape)) if len(shape) else "scalar"


def _module_label(module: nn.Module) -> str:
    if isinstance(module, nn.Conv2d):
        return f"Conv2d {module.in_channels}→{module.out_channels} {module.kernel_size[0]}×{module.kernel_size[1]}"
    if isinstance(module, nn.Linear):
        return f"Linear {module.in_features}→{module.out_features}"
    if isinstance(module, nn.MaxPool2d):
        return f"MaxPool2d {module.kernel_size}"
    return type(module).__name__


def forward_graph(model: nn.Module, x: torch.Tensor) -> dict:
    """The model's forward data-flow graph, one node per module call or function, with output shapes."""
    traced = fx.symbolic_trace(model)
    ShapeProp(traced).propagate(x)
    nodes, edges = [], []
    for node in traced.graph.nodes:
        meta = node.meta.get("tensor_meta")
        shape = f"\n{shape_text(meta.shape)}" if meta is not None and hasattr(meta, "shape") else ""
        if node.op == "placeholder":
            kind, label = "input", f"input {node.name}"
        elif node.op == "output":
            kind, label = "output", "output"
        elif node.op == "call_module":
            kind, label = "module", f"{node.target}: {_module_label(traced.get_submodule(node.target))}"
        elif node.op == "get_attr":
            kind, label = "param", str(node.target)
        else:
            kind, label = "op", getattr(node.target, "__name__", str(node.target))
        nodes.append({"id": node.name, "label": label + shape, "kind": kind, "op": node.op})
        edges += [[src.name, node.name] for src in node.all_input_nodes]
    return {"nodes": nodes, "edges": edges, "code": traced.code.strip()}


def saved_tensors(fn, distinct: dict[tuple[int, int], int] | None = None) -> list[dict]:
    """A backward node's saved tensors (`_saved_<name>` attributes that hold tensors); `distinct`
    collects (address, bytes) → bytes, so a tensor saved by two nodes is counted once."""
    saved = []
    for attr in dir(fn):
        if not attr.startswith("_saved_"):
            continue
        value = getattr(fn, attr)
        if isinstance(value, torch.Tensor):
            nbytes = value.numel() * value.element_size()
            if distinct is not None:
                distinct[(value.data_ptr(), nbytes)] = nbytes
            saved.append(
                {
                    "name": attr.removeprefix("_saved_"),
                    "shape": list(value.shape),
                    "dtype": DTYPE_SHORT.get(value.dtype, str(value.dtype)),
                    "bytes": nbytes,
                }
            )
    return saved


def autograd_graph(model: nn.Module, loss: torch.Tensor) -> dict:
    """The backward graph autograd recorded for `loss`, before backward runs (saved tensors intact)."""
    names = {id(p): name for name, p in model.named_parameters()}
    nodes, edges = [], []
    ids: dict[int, str] = {}
    keep = []  # hold every visited node so that no id() is reused while the walk runs
    distinct: dict[tuple[int, int], int] = {}

    def node_id(fn) -> str:
        if id(fn) not in ids:
            ids[id(fn)] = f"b{len(ids)}"
            keep.append(fn)
        return ids[id(fn)]

    stack, done = [loss.grad_fn], set()
    while stack:
        fn = stack.pop()
        fn_id = node_id(fn)
        if fn_id in done:
            continue
        done.add(fn_id)
        if hasattr(fn, "variable"):  # AccumulateGrad: writes a parameter's .grad
            nodes.append(
                {
                    "id": fn_id,
                    "label": f"AccumulateGrad\n{names.get(id(fn.variable), '?')} {shape_text(fn.variable)}",
                    "kind": "accumulate",
                    "name": "AccumulateGrad",
                    "saved": [],
                }
            )
        else:
            saved = saved_tensors(fn, distinct)
            nodes.append({"id": fn_id, "label": fn.name(), "kind": "backward", "name": fn.name(), "saved": saved})
            for i, s in enumerate(saved):
                saved_id = f"{fn_id}s{i}"
                label = f"{s['name']} {shape_text(torch.Size(s['shape']))} {s['dtype']}"
                nodes.append({"id": saved_id, "label": label, "kind": "saved", "name": s["name"], "saved": []})
                edges.append([saved_id, fn_id, "saved"])
        for next_fn, _ in fn.next_functions:
            if next_fn is not None:
                edges.append([fn_id, node_id(next_fn)])
                stack.append(next_fn)
    backward = [n for n in nodes if n["kind"] in ("backward", "accumulate")]
    return {
        "nodes": nodes,
        "edges": edges,
        "backward_nodes": len(backward),
        "saved_tensors": sum(len(n["saved"]) for n in backward),
        "saved_bytes": sum(s["bytes"] for n in backward for s in n["saved"]),
        # a ReLU output its pool saves again counted once
        "saved_distinct_bytes": sum(distinct.values()),
    }


# --- torch.compile: joint graph, generated code, eager vs compiled -----------------------------------

ARTIFACT_LOGGERS = ("torch._functorch._aot_autograd", "torch._inductor")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, record.getMessage()))


@contextlib.contextmanager
def captured_compile_artifacts() -> Iterator[_Capture]:
    """Turn on torch's `aot_joint_graph` and `output_code` logs and keep them off the terminal."""
    capture = _Capture()
    torch._logging.set_logs(aot_joint_graph=True, output_code=True)
    loggers = [logging.getLogger(name) for name in ARTIFACT_LOGGERS]
    saved = [(lg.handlers, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers, lg.propagate = [capture], False
    try:
        yield capture
    finally:
        for lg, (handlers, propagate) in zip(loggers, saved, strict=True):
            lg.handlers, lg.propagate = handlers, propagate
        torch._logging.set_logs()


JOINT_LINE = re.compile(r"^\s*(\w+)(?:: \"([^\"]*)\")? = (.+)$")
KERNEL_NAME = re.compile(r"\b(cpp_fused_\w+|triton_\w+?_fused_\w+)\b")
IDENTIFIER = re.compile(r"\b([A-Za-z_]\w*)\b")


def parse_joint_graph(text: str) -> dict:
    """Nodes and edges of AOTAutograd's printed joint graph: one node per `name = op(args)` line."""
    nodes: list[dict] = []
    edges: list[list[str]] = []
    known: set[str] = set()
    for name in re.findall(r"\b((?:primals|tangents)_\d+): \"", text):
        if name not in known:
            known.add(name)
            # primals: the parameters and the batch; tangents: the gradient arriving at the output
            nodes.append({"id": name, "label": name, "kind": "input", "op": "input"})
    for line in text.splitlines():
        if line.strip().startswith("return"):
            nodes.append({"id": "return", "label": "return (outputs, gradients)", "kind": "output", "op": "output"})
            edges += [[src, "return"] for src in dict.fromkeys(IDENTIFIER.findall(line)) if src in known]
            continue
        match = JOINT_LINE.match(line)
        if not match or "fx_pytree" in line:
            continue
        name, meta, rhs = match.groups()
        expression = rhs.split(";")[0]
        op = re.sub(r"^torch\.ops\.(aten|prims)\.", "", expression.split("(")[0]).removesuffix(".default")
        if "[" in op:  # `getitem = tuple_value[0]`
            op = "getitem"
        label = op + (f"\n{meta.split('[')[0]}[{meta.split('[')[1].split(']')[0]}]" if meta else "")
        nodes.append({"id": name, "label": label, "kind": "op", "op": op})
        edges += [[src, name] for src in dict.fromkeys(IDENTIFIER.findall(expression)) if src in known]
        known.add(name)
    return {"nodes": nodes, "edges": edges}


def median_step_ms(
    models: dict[str, tuple[nn.Module, torch.optim.Optimizer]], x: torch.Tensor, y: torch.Tensor, repeats: int
) -> dict[str, float]:
    """Median training-step time per model, one step of each in turn (measure.timing's interleaving),
    so machine noise hits all alike."""
    contenders = [
        Contender(name, lambda m=model, o=optimizer: train_step(m, o, x, y), x.device)
        for name, (model, optimizer) in models.items()
    ]
    time_interleaved(contenders, steps=repeats, rounds=repeats, warmup=0)
    return {c.name: 1000 * c.median_s for c in contenders}


def compile_and_compare(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    x: torch.Tensor,
    y: torch.Tensor,
    repeats: int = 20,
    cold: bool = True,
) -> dict:
    """torch.compile the model (Inductor), capture its joint graph and generated code, and time a
    training step eager and compiled. `cold` compiles into a fresh, empty Inductor cache."""
    eager = copy.deepcopy(model)
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model)
    optimizers = {"eager": make_optimizer(eager), "compiled": make_optimizer(compiled_model)}
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        cache = None
        if cold:
            from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

            cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="dlscope-inductor-"))
            stack.enter_context(temporary_cache_dir(cache))
        capture = stack.enter_context(captured_compile_artifacts())
        start = time.perf_counter()
        train_step(compiled, optimizers["compiled"], x, y)  # compiles forward and backward
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        compile_seconds = time.perf_counter() - start
    joint = next((m for n, m in capture.records if n.endswith("__aot_joint_graph") and "Joint graph" in m), "")
    codes = [m for n, m in capture.records if n.endswith("__output_code") and m.startswith("Output code:")]
    code = {}
    for text in codes:
        kind = re.search(r"AOT ID: \['\d+_(\w+)'\]", text)
        code[kind.group(1) if kind else f"graph{len(code)}"] = text.removeprefix("Output code:").strip()
    train_step(eager, optimizers["eager"], x, y)  # warm-up: allocator, oneDNN primitives
    step_ms = median_step_ms(
        {"eager": (eager, optimizers["eager"]), "compiled": (compiled, optimizers["compiled"])}, x, y, repeats
    )
    joint_text = joint[joint.find("class ") :] if "class " in joint else joint
    return {
        "backend": "inductor",
        "device": str(x.device),
        "generated_language": "Triton" if x.device.type == "cuda" else "C++ (OpenMP)",
        "cache": "cold" if cold else "warm",  # a fresh, empty Inductor cache, or the user's
        "compile_seconds": compile_seconds,
        "batch_size": len(x),
        "repeats": repeats,
        "step_ms": step_ms,
        "speedup": step_ms["eager"] / step_ms["compiled"],
        "joint_graph_code": joint_text,
        "joint_graph": parse_joint_graph(joint_text),
        "generated_code": code,
        "kernels": sorted(set(KERNEL_NAME.findall("\n".join(code.values())))),
    }


def loss_on_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)
