"""Runs in dlscope's process WHILE the job runs: start the command with the bootstrap (session.py,
the doctor's trials), trace its system calls (iotrace/), watch it and capture a hung job's state
(watchdog, capture, ondemand), attach the profiler on demand and read it live (attach, watching).
It talks to the job only through dlscope.contract, and hands what the job left to dlscope.analysis."""
