"""The processes around a run: the launcher (launch.py, `python -m hybrid_engine.launch`), a bare srun task taken for
a rank (slurm.py, with SLURM's host lists in hostlist.py), the heartbeat that ends every rank together when one is
lost (faults.py, exit_together.py, peer_processes.py), the communication check before the first step
(comm_check.py), where a hung step was waiting (hang_report.py), Ctrl-C and SIGTERM (interrupts.py; the other
commands' Ctrl-C and closed pipe: entry.py), and the documented test hooks (fault_plan.py). Imports: config only;
process groups and the grid's ranks come in as plain values."""
