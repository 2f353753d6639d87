"""Section environment: the environment table (实验环境) the handouts ask every report to fill in."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Table

TITLE = "Environment"


def render(section: dict[str, Any]) -> list[Block]:
    rows = [list(r) for r in environment_rows(section)]
    return [Table(["", "item", "value"], rows, "实验环境 — the machine these results were measured on")]


def environment_rows(env: dict) -> list[tuple[str, str, str]]:
    """(category, item, value) rows in the handouts' table layout."""
    cpu = f"{env['cpu_model']} — {env['logical_cpus']} vCPU ({env['physical_cores']} physical)"
    return [
        ("硬件环境 hardware", "CPU (vCPU)", cpu),
        ("", "CPU capability", str(env["cpu_capability"])),
        ("", "memory", f"{env['memory_gib']} GiB"),
        ("", "GPU (model, count)", env["gpu_summary"] if env["gpus"] else "none"),
        ("软件环境 software", "OS", f"{env['os']} (kernel {env['kernel']})"),
        ("", "framework", f"PyTorch {env['torch']} (oneDNN {'on' if env['mkldnn'] else 'off'})"),
        ("", "Python, numpy", f"Python {env['python']}, numpy {env['numpy']}"),
        ("", "CUDA / cuDNN", f"{env['cuda'] or 'none'} / {env['cudnn'] or 'none'}"),
        ("", "threads", f"{env['torch_threads']} intra-op, {env['torch_interop_threads']} inter-op"),
    ]
