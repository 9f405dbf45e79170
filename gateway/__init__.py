"""agent-gateway: a policy-enforcing gateway between untrusted LLM agents and a machine.

The analyser's names are imported on first use (PEP 562), so `import gateway.X` costs only X:
the hook client and the CLI's start-up do not pay for the parser unless they use it."""

from typing import TYPE_CHECKING, Any

from gateway.version import __version__ as __version__

if TYPE_CHECKING:
    from gateway.analysis import Analysis, Command, analyze

__all__ = ["Analysis", "Command", "analyze"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # lazy: startup (PEP 562: `import gateway.X` does not load the parser)
        import gateway.analysis

        return getattr(gateway.analysis, name)
    raise AttributeError(f"module 'gateway' has no attribute {name!r}")
