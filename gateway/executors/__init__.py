"""Executors: one module per tool family. Every one runs through gateway.sandbox."""
