"""The gateway's version: a shared value (the audit exporters name it), importable without the
package's lazy names (gateway/__init__.py)."""

__version__ = "0.1.0"
