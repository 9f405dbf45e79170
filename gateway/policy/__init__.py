"""Policies: YAML (schema.py) -> validated layers (loader.py, layers.py) -> compiled rules and a
casbin enforcer (compile.py) -> inline examples checked (selftest.py)."""

from gateway.policy.compile import CompiledPolicy, compile_policy, load_policy
from gateway.policy.loader import PolicyError

__all__ = ["CompiledPolicy", "PolicyError", "compile_policy", "load_policy"]
