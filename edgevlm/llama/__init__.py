"""The llama.cpp boundary: the only package that imports llama_cpp.

One file per C handle or concern: the model and its context (engine), a sequence and its KV
ledger (sequence), continuous batching (batcher), sampling and grammars (sampling, grammar),
the projector (vision), the tokenizer alone (vocab), ggml devices and RPC (backends), and
llama.cpp's log (logs). `types` holds the values the rest of edgevlm names, and imports
nothing native, so naming a type never loads libllama.
"""
