"""The `gateway` command's entry point. `gateway hook AGENT ...`, which an agent runs for every
tool call, goes straight to the thin client (gateway/hook_client.py) without importing the CLI
(argparse, json, the command table); everything else (`gateway hook codex --check` too) is
`gateway.cli.main`."""

import sys


def main() -> int:
    checking = sys.argv[2:3] == ["codex"] and ("--check" in sys.argv or "--trust" in sys.argv)
    if sys.argv[1:2] == ["hook"] and not checking:
        # lazy: startup (a hook call loads the client and nothing of the CLI)
        from gateway import hook_client

        return hook_client.main(sys.argv[2:])
    # lazy: startup (the hook client above does not pay for the CLI)
    from gateway.cli import main as cli_main

    return cli_main()
