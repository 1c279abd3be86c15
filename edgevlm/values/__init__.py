"""Plain values both sides of the llama.cpp boundary speak: sampler settings, projector rows,
what a request cost. Nothing native is imported here."""
