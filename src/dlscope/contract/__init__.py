"""What the user's process and dlscope exchange, named once: the environment variables the job is
started with, the signals it answers, the files it writes under `<run dir>/processes/` and their
binary layouts (steps, batches, live status, profile requests), the syscall event record.

Both sides import it; neither imports the other. Stdlib only: the job loads it at start-up."""
