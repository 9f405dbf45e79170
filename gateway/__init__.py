"""agent-gateway: a policy-enforcing gateway between untrusted LLM agents and a machine."""

from gateway.analysis import Analysis, Command, analyze

__all__ = ["Analysis", "Command", "analyze"]
__version__ = "0.1.0"
