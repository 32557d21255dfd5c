"""A decoder-only transformer (GPT-2 style): the plain model and its cost per layer (model.py), and its tensor-
and sequence-parallel plan (parallelize.py)."""
