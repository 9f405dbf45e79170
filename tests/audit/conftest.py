"""The pipeline's fixtures (a permissive policy, a workspace the sandbox owns), for the tests
that run calls through a gateway whose log fills up."""

from tests.test_gateway import policy, ws

__all__ = ["policy", "ws"]
