"""A conversation on one sequence: the KV ledger, prompts, the summary swap, history replay,
answer shapes (JSON grammars, tool calls) and the chat an API client resends."""
