"""The handouts' environment table (实验环境): hardware and software a result was measured on."""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

import numpy as np
import psutil
import torch


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _os_name() -> str:
    try:
        text = Path("/etc/os-release").read_text()
        match = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', text, re.M)
        if match:
            return match.group(1)
    except OSError:
        pass
    return platform.platform()


def _gpus() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
            }
        )
    return gpus


def collect_environment() -> dict:
    """Facts about this machine and software stack, as plain JSON values."""
    gpus = _gpus()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus,
        "gpu_summary": ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpus) or "none",
        "os": _os_name(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }
