"""A decoder-only transformer (GPT-2 style): the model and its cost per layer (model.py), and its tensor-parallel
twins with sequence parallelism (parallelize.py)."""
