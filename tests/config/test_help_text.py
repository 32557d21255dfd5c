"""--help describes what the driver trains: every model of the registry, by the first sentence of its options'
docstring (the one source of its description), and the data each one trains on; no table's heading names one
model's data as everyone's."""
import re

from hybrid_engine.config.fields import class_doc
from hybrid_engine.models import registry
from hybrid_engine.train.cli import build_parser


def test_help_describes_every_registered_model_and_its_data():
    text = build_parser("hybrid_engine.py").format_help()
    description = text[text.index("\n\n"):text.index("\noptions:")]
    for name, options in registry.options().items():
        line = f"  {name}: {class_doc(options)}"
        assert line in description, (name, description)
    assert "Llama" in description and "course MLP" in description and "GPT" in description
    (data,) = re.findall(r"^\[data\] (.*)$", text, re.M)
    assert "synthetic regression" not in data and "--data" in data and "Llama" in data, data
    flat = " ".join(text.split())
    assert re.search(r"--batch-size B Global batch size [^(]*\([^)]*\): samples for the MLP, sequences for the GPT "
                     r"and the Llama", flat), flat
