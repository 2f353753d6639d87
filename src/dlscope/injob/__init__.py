"""Runs INSIDE the user's process (and its DataLoader workers and ranks), loaded by the bootstrap
(injob/bootstrap/sitecustomize.py) that `dlscope run` puts first on PYTHONPATH: torch's extension
points turned into step events, the step machine, the batch x-ray, the GPU clock, the hang agent,
the doctor's change under trial, the audit hook of the proc I/O backend.

Every line here costs the job: stdlib and torch only (numpy and analysis code never), fork-safe,
cheap on the per-step path. What it writes for dlscope to read is laid out in dlscope.contract;
it imports nothing of dlscope but the contract, dlscope.measure and dlscope.phases
(tests/test_architecture.py enforces it)."""
