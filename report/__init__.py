"""Technical report of hybrid_engine, built from experiments/results/ (see report/README.md)."""
