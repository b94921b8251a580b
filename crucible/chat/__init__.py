"""``llm-engine chat``, the terminal chat (a cli-layer package).

main.py parses the flags and picks the backend: local.py (the engine in this process) or
remote.py (a server's /v1/chat/completions stream); term.py reads input (prompt_toolkit on a
terminal, plain lines from a pipe); session.py holds the conversation and runs a turn, with
reply.py measuring it and cancelling it on Ctrl-C; commands.py is the read loop and the
/commands.
"""
