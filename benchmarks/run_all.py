"""Run every benchmark script in this folder, one after another (`make bench`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for script in sorted(here.glob("*.py")):
        if script.name != Path(__file__).name:
            print(f"== {script.name}", flush=True)
            subprocess.run([sys.executable, str(script)], check=True)
