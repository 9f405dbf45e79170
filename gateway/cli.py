"""The `gateway` command. Thin: parse arguments, call the library, print, exit.

Exit codes (DESIGN.md section 5): 0 allow / success, 1 deny, 2 usage or config error, 3 ask.
"""

from __future__ import annotations

import argparse
import json
import sys

from gateway.analysis import analyze

EXIT_OK, EXIT_DENY, EXIT_USAGE, EXIT_ASK = 0, 1, 2, 3


def _cmd_analyze(args: argparse.Namespace) -> int:
    text = " ".join(args.command) if args.command else sys.stdin.read()
    result = analyze(text, second_opinion_enabled=not args.no_second_opinion)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    elif result.denial is not None:
        print(f"denied ({result.denial.code}): {result.denial.message}")
    else:
        for cmd in result.commands:
            argv = " ".join(json.dumps(w.value, ensure_ascii=False) for w in cmd.argv) or "(no program)"
            where = "/".join(c.value for c in cmd.context) or "top"
            print(f"{argv}    [{where}]")
        op = result.second_opinion
        extra = f" ({', '.join(op.blind_spots) or op.detail})" if (op.blind_spots or op.detail) else ""
        print(f"second opinion: {op.status.value}{extra}")
    return EXIT_DENY if result.denied else EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    print(
        "gateway serve: the MCP server is not built yet (it lands with the serve issue). "
        "Today you can try the analyser: gateway analyze -- 'ls | grep x'",
        file=sys.stderr,
    )
    return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gateway", description="agent-gateway: a policy gate for LLM agents")
    sub = ap.add_subparsers(dest="verb", required=True)
    an = sub.add_parser("analyze", help="show every command a shell text would run (runs nothing)")
    an.add_argument("--json", action="store_true", help="print the analysis as JSON")
    an.add_argument("--no-second-opinion", action="store_true", help="skip the bashlex cross-check")
    an.add_argument("command", nargs=argparse.REMAINDER, help="the shell text (after --); stdin if absent")
    an.set_defaults(func=_cmd_analyze)
    sv = sub.add_parser("serve", help="serve the gateway to MCP clients (not built yet)")
    sv.set_defaults(func=_cmd_serve)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) and args.command[0] == "--":
        args.command = args.command[1:]
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
