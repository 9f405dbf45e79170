"""Shell text -> every command that would run, or a denial (docs/analysis.md)."""

from gateway.analysis.analyzer import analyze
from gateway.analysis.model import (
    Analysis,
    Assignment,
    Command,
    Context,
    Denial,
    Expansion,
    Flag,
    OpinionStatus,
    Redirect,
    RedirectMode,
    SecondOpinion,
    Word,
)

__all__ = [
    "Analysis",
    "Assignment",
    "Command",
    "Context",
    "Denial",
    "Expansion",
    "Flag",
    "OpinionStatus",
    "Redirect",
    "RedirectMode",
    "SecondOpinion",
    "Word",
    "analyze",
]
