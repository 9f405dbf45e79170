"""Tool calls, as validated values. Only `run` exists so far (docs/tools.md lists the tools)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RunCall(BaseModel):
    """Run one shell command (the `run` tool)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: Literal["run"] = "run"
    principal: str
    command: str = Field(min_length=1)
    """The shell text, as an agent wrote it."""
    cwd: str | None = None
    """Directory to run in (default: the workspace). Must lie in the principal's roots."""
    env: dict[str, str] = {}
    """Variables to set for the command; each name must be allowed by the rules deciding it."""
    timeout_ms: int | None = Field(default=None, gt=0)
    """Wall-clock limit; capped by the policy's limit."""
