"""The processes around a run: the launcher (launch.py, `python -m hybrid_engine.launch`), the heartbeat that ends
every rank together when one is lost (faults.py, exit_together.py, peer_processes.py), Ctrl-C and SIGTERM
(interrupts.py), and the documented test hooks (fault_plan.py). Imports: config only."""
