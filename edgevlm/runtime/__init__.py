"""The composition root: flags to facts, family, plan, engine and a loaded model (loading.py),
and the one place conversations and describers are made (conversations.py)."""
