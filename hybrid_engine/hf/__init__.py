"""Hugging Face checkpoints in and out (`python -m hybrid_engine.hf import|export`): LlamaForCausalLM, and Mistral
and Qwen2 where their configs say no more than a Llama with a window or q/k/v biases.

    hf_config.py          config.json <-> LlamaConfig; the first key or value the engine cannot honour, named
    weights.py            HF tensor names and layouts <-> the engine's, one layer at a time
    safetensors_files.py  reading model.safetensors (or its sharded index) tensor by tensor; writing shards
    output_folder.py      where they write: never an input or a run's directory; an export's folder swapped in whole
    llama.py              the Llama's mapping as one module: what its registry entry's hf names
    convert.py            import_model / export_model, streaming through checkpoint/offline.py; the model is the
                          registered one whose mapping reads the architecture or wrote the checkpoint
    __main__.py           the command

A package of its own above models/ and checkpoint/ (it imports both and nothing imports it): converting is a
command, like sample and data prepare, not part of a model or of the checkpoint format.
"""
