"""Executors: one module per tool family. Everything that runs a program goes through
gateway.sandbox; the file tools (files.py) and the env store (env.py) run no program."""
