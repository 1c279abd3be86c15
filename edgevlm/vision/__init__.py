"""How images reach the model: decoding them, and each family's layout of views and tokens.

Pure: nothing here imports llama_cpp.
"""
