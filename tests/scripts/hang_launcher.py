"""A hand-rolled launcher (no torchrun to notice a dead rank): starts hang_ddp.py as ranks 0 and 1
with the env:// rendezvous and waits for rank 0 first. `--exit-rank R --exit-step S --exit-code C`:
rank R leaves with os._exit(C) at step S, and rank 0 waits for it in a collective."""

import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "hang_ddp.py"


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(subprocess.Popen([sys.executable, str(SCRIPT), *sys.argv[1:]], env=env))
    codes = [p.wait() for p in ranks]  # rank 0 first: a dead rank 1 stays unreaped meanwhile
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
