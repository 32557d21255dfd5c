"""Training data for the token models: token files and their header (token_files.py), the datasets that draw a
step's sequences from (seed, step) alone (datasets.py), and `python -m hybrid_engine.data prepare` (prepare.py).
Imports: config (ConfigError, paths_apart) only."""

from .datasets import MarkovChain, TokenDataset, markov_corpus, open_dataset
from .prepare import main, prepare
from .token_files import MAGIC, DataError, fingerprint, load_tokens, read_header, tokenizer_path, write_token_file

__all__ = ["DataError", "MAGIC", "MarkovChain", "TokenDataset", "fingerprint", "load_tokens", "main", "markov_corpus",
           "open_dataset", "prepare", "read_header", "tokenizer_path", "write_token_file"]
