"""Hooks for the agents people already run (Claude Code, Codex, Gemini CLI): their pre-tool-use
hook asks a resident gateway (`daemon.py`) through a thin client (`gateway/hook_client.py`),
which decides with the same policy and stages as every other surface (`service.py`) and answers
in the agent's own format (`formats.py`). docs/hooks.md says how to install each."""
