"""llama.cpp's RPC: endpoints a model is split over, and the worker that serves a device."""
