"""What a command does to files, through the operating system: syscall events from eBPF
tracepoints, strace or a Python audit hook (injob/audit.py), split into phases by `dlscope.phase`
markers, streamed into tables (dlscope.analysis.syscalls), exports and a hook-point map."""
