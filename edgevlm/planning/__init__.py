"""Memory planning: the hardware probe, what a model costs, and a split over several devices.

Pure arithmetic over GGUF facts: nothing here imports llama_cpp.
"""
