"""The training loop and the commands around it: the driver (cli.py: flags -> RunConfig -> Trainer), the loop
(trainer.py), its divergence guard (divergence.py), progress lines and metrics (progress.py), the lr schedule and
the update's other settings (lr_schedule.py, update_settings.py), evaluation (evaluate.py) and `python -m
hybrid_engine.sample` (sample.py). The top floor: it may import every other package."""
