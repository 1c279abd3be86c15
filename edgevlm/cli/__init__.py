"""The command line: commands, their options, what they print, the chat REPL and bench."""
