"""Runs AFTERWARDS, in dlscope's own process: stateless functions of the records a run left (step
rows, JSON records, batch records, profiler traces, syscall events), read once (observed.py's
`Observed`) and handed to each analyser — facts out (numbers, keys, levels), the words are in
dlscope.report. numpy allowed; torch never (tests/test_architecture.py enforces both)."""
