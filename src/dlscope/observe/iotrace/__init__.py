"""What a command does to files, through the operating system: syscall events from eBPF
tracepoints, strace or a Python audit hook, split into phases by `dlscope.phase` markers,
turned into per-phase and per-file tables, a data-flow graph and a hook-point map."""
