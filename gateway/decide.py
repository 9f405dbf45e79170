"""The decision stages. `evaluate()` is pure: it runs the decision stages and nothing else (no
prompts, no processes; the only I/O is reading the filesystem to resolve paths). `gateway check`
is exactly this. Execution, approval and audit come with the pipeline issue.

Stages, in order, each able only to make the verdict stricter:

    parse        the analyser: every command, or a denial        (gateway.analysis)
    tool         may this principal use the tool family at all    (casbin)
    permissions  the rule deciding each command                   (stages/permissions.py)
    second       an unconfirmed second opinion: the policy decides (default ask)
    pathjail     every path inside the principal's roots          (stages/pathjail.py)

Any exception inside a stage is a denial with code `internal_error`: fail closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway import programs
from gateway.analysis import Analysis, Assignment, Command, OpinionStatus, Word, analyze, unset
from gateway.analysis.hazards import PROTECTED_PREFIXES, PROTECTED_VARIABLES
from gateway.decision import Decision, Reason, Verdict
from gateway.executors.shell import scrubbed_env
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.policy.selftest import Case
from gateway.sandbox.plan import proxy_environment
from gateway.stages import decision_cache, pathjail, permissions


@dataclass(frozen=True)
class CheckResult:
    decision: Decision
    analysis: Analysis | None
    models: tuple[dict[str, Any] | None, ...] = ()
    """Per command: how its program's model read it (gateway/programs/), or None (no model)."""

    def to_json(self) -> dict[str, Any]:
        out = self.decision.to_json()
        out["commands"] = [c.to_json() for c in self.analysis.commands] if self.analysis else []
        for entry, model in zip(out["commands"], self.models, strict=False):
            if model is not None:
                entry["model"] = model
        if self.analysis is not None:
            out["second_opinion"] = self.analysis.second_opinion.to_json()
        return out


def _stored(policy: CompiledPolicy, name: str) -> bool:
    """Whether the env tool may set `name` (the policy's `environment.allow`, protected names never)."""
    if name in PROTECTED_VARIABLES or name.startswith(PROTECTED_PREFIXES):
        return False
    allowed = policy.policy.environment.allow
    return any(name == a or (a.endswith("*") and name.startswith(a[:-1])) for a in allowed)


# What a `run` call's shell starts with besides the call's env and the stored variables: the
# allowlist (executors/shell.py), and the sandbox's HOME and git settings (sandbox/plan.py).
_BASE_ENV = frozenset(scrubbed_env({})) | {"HOME"}


def _may_be_set(policy: CompiledPolicy, principal: str, env: dict[str, str] | None, name: str) -> bool:
    """Could a `run` call's new shell start with `name` set (analysis/unset.py)? Its fixed
    names, the network policy's (the proxy, the presets' variables, the CA bundle, secrets'
    placeholders), the call's, and any the env tool may have stored."""
    if name in _BASE_ENV or name in (env or {}) or name.startswith("GIT_"):
        return True
    _, egress = policy.network_of(principal)
    if egress is not None and name in proxy_environment(egress):
        return True
    if name in PROTECTED_VARIABLES or name.startswith(PROTECTED_PREFIXES):
        return True
    allowed = policy.policy.environment.allow
    return any(name == a or (a.endswith("*") and name.startswith(a[:-1])) for a in allowed)


UNFINISHED = (OpinionStatus.TIMEOUT, OpinionStatus.FAILED)
"""A second opinion that did not finish: the next decision asks again, so it is not kept."""


def evaluate(
    policy: CompiledPolicy,
    command: str,
    principal: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    tool: Tool = Tool.RUN,
    homes: pathjail.Homes | None = None,
    sandboxed: bool = False,
    fresh_shell: bool = False,
) -> CheckResult:
    """The decision for running `command` as `principal` in `cwd` (default: the workspace), with
    `env` set for it (checked like `NAME=value` before every command), through `tool` (run,
    session or processes: the principal must be allowed that tool family). `homes`: what `~`
    means to the shell that will run it (default: the gateway's sandbox, the policy's `home`).
    `sandboxed`: the command will run in the gateway's sandbox, which masks the policy's
    deny_read paths; without it (an agent runs it itself) a search reading a tree that holds one
    is refused. `fresh_shell`: the text runs in a new bash whose environment the gateway builds
    (a `run` call), so a variable nothing could have set is empty (analysis/unset.py). A
    decision made before for the same inputs is served from the policy's cache
    when every path component it resolved is still as it was (stages/decision_cache.py)."""
    variables = tuple(sorted((env or {}).items()))
    key = (principal, str(cwd) if cwd is not None else None, variables, tool, command, homes, sandboxed, fresh_shell)
    found = policy.decisions.get(key) if policy.casbin.enforcing else None
    if isinstance(found, CheckResult):
        return found
    with decision_cache.observing() as seen, pathjail.shell_homes(homes):
        result = _evaluate(policy, command, principal, cwd, env, tool, sandboxed, fresh_shell)
    failed = any(r.stage == "pipeline" for r in result.decision.reasons)
    analysis = result.analysis
    unfinished = analysis is not None and analysis.second_opinion.unfinished
    if not failed and not unfinished:
        policy.decisions.put(key, result, seen)
    return result


def _evaluate(
    policy: CompiledPolicy,
    command: str,
    principal: str,
    cwd: Path | None,
    env: dict[str, str] | None,
    tool: Tool,
    sandboxed: bool = False,
    fresh_shell: bool = False,
) -> CheckResult:
    analysis: Analysis | None = None
    try:
        grant = policy.grant(principal)
        analysis = analyze(command)
        if analysis.denial is not None:
            d = analysis.denial
            return CheckResult(
                Decision(Verdict.DENY, None, (Reason("parse", d.code, d.message, None, d.details),)), analysis
            )
        if fresh_shell:
            commands = unset.resolve(command, analysis.commands, lambda name: _may_be_set(policy, principal, env, name))
            analysis = replace(analysis, commands=commands)
        decisions: list[Decision] = []
        family = tool_decision(policy, principal, tool)
        if family.verdict is not Verdict.ALLOW:  # an allow names no rule: the command's rule decides
            decisions.append(family)
        all_matches: list[list[permissions.Match]] = []
        models: list[dict[str, Any] | None] = []
        # a call's variable whose name `environment.allow` covers needs no rule's leave: the env
        # tool could set it for every later call anyway (and a session's `env` is held to that
        # list alone); any other is decided as `NAME=value` before each command, by the rules
        extra = tuple(Assignment(k, Word(v, (), v)) for k, v in (env or {}).items() if not _stored(policy, k))
        for name in env or {}:
            if name in PROTECTED_VARIABLES or name.startswith(PROTECTED_PREFIXES) or not name.isidentifier():
                reason = Reason("parse", "protected_variable", f"env: setting {name} is refused")
                return CheckResult(Decision(Verdict.DENY, None, (reason,)), analysis)
        for cmd in analysis.commands:
            if extra and cmd.argv:
                cmd = replace(cmd, assignments=cmd.assignments + extra)
            decision, matches = permissions.decide_command(policy, principal, cmd)
            decisions.append(decision)
            all_matches.append(matches)
            models.append(_model_json(cmd, matches))
        opinion = analysis.second_opinion
        if not opinion.confirmed:
            verdict = Verdict.parse(policy.policy.second_opinion.unconfirmed.value)
            what = "; ".join(x for x in (", ".join(opinion.blind_spots), opinion.detail) if x) or opinion.status.value
            decisions.append(
                Decision(
                    verdict,
                    None,
                    (
                        Reason(
                            "second_opinion",
                            f"unconfirmed_{opinion.status.value}",
                            f"neither second parser (bashlex, mvdan/sh) could confirm the analysis ({what})",
                        ),
                    ),
                )
            )
        decisions.append(
            pathjail.check(policy, grant, cwd or policy.workspace, analysis.commands, all_matches, sandboxed)
        )
        return CheckResult(_strictest(decisions), analysis, tuple(models))
    except Exception as exc:  # fail closed: a broken stage is a denial, never an allow
        reason = Reason("pipeline", "internal_error", f"{type(exc).__name__}: {exc}")
        return CheckResult(Decision(Verdict.DENY, None, (reason,)), analysis)


def _model_json(cmd: Command, matches: list[permissions.Match]) -> dict[str, Any] | None:
    """How the command's program model read it, and whether the deciding rules used that
    reading for the path jail (`applied`) or their own `path_args`."""
    used = next((m.reading for m in matches if m.reading is not None), None)
    found = used or (programs.reading_of(cmd) if cmd.argv else None)
    if found is None:
        return None
    return {**found.to_json(), "applied": used is not None}


def tool_decision(policy: CompiledPolicy, principal: str, tool: Tool) -> Decision:
    """May `principal` use the tool family at all (casbin, by level)."""
    verdict = Verdict.parse(policy.tool_decision(principal, tool).value)
    if verdict is Verdict.ALLOW:
        return Decision(Verdict.ALLOW, None, ())
    level = policy.grant(principal).level
    if verdict is Verdict.ASK:
        message = f"the {tool.value} tool asks a supervisor for {principal} (level {level}; the policy's tools section)"
    else:
        message = f"{principal} (level {level}) may not use the {tool.value} tool (the policy's tools section)"
    return Decision(verdict, None, (Reason("tool", f"tool_{verdict.label}", message),))


def _strictest(decisions: list[Decision]) -> Decision:
    """The strictest verdict; its rule decides. An allow keeps only the rules' reasons."""
    merged = Decision.merge(decisions)
    if merged.verdict is Verdict.ALLOW:
        return merged
    # the rule of a denial is the rule that denied, not an allowing rule of another command
    rule = next((d.rule for d in decisions if d.verdict is merged.verdict and d.rule), None)
    reasons = tuple(r for d in decisions if d.verdict is merged.verdict for r in d.reasons)
    return Decision(merged.verdict, rule, reasons)


def example_decisions(policy: CompiledPolicy, principal: str) -> list[Case]:
    """Each rule's `match` examples decided as a call is (`evaluate`: parse, tool family, rules,
    second opinion, path jail, in the workspace): the verdict must be the rule's, and for an ask
    or a deny the rule among those making it (an allow names one of the rules allowing it). It
    is decided for `principal`, and where that fails or `principal` may not use the rule, for
    each other principal of the policy that may: an example shows what the rule does for
    someone. A rule nobody may use (a fragment of a policy) is checked by its match alone
    (`selftest.example_cases`). Where the `run` family itself asks for a principal (`tools: {run:
    {ask_from: N}}`: seed 004's supervisor level), a supervisor hears every command of that
    principal: an allow rule's example is then asked about, as the rule and the family say
    together."""
    cases: list[Case] = []
    for rule in policy.policy.rules:
        users = [p for p in [principal, *sorted(policy.grants)] if p in policy.grants and policy.may_use(p, rule)]
        for text in rule.examples.match if rule.examples is not None else ():  # an upstream tool's rule has none
            name = f"{rule.id}: {text!r} is {rule.decision.value}"
            if not users:
                cases.append(Case(name, True, "no principal of the policy may use the rule: checked by its match"))
                continue
            first = ""
            for who in dict.fromkeys(users):
                got = evaluate(policy, text, who).decision
                named = {got.rule} | {r.rule for r in got.reasons if r.rule}
                family = tool_decision(policy, who, Tool.RUN).verdict
                expected = max(Verdict.parse(rule.decision.value), family)
                by_family = expected is not Verdict.parse(rule.decision.value)  # the family's ask names no rule
                if got.verdict is expected and (got.verdict is Verdict.ALLOW or by_family or rule.id in named):
                    cases.append(Case(f"{name} for {who}", True))
                    break
                why = "; ".join(r.message for r in got.reasons)[:300]
                first = first or f"for {who}: {got.verdict.label} ({got.rule or 'no rule'}: {why})"
            else:
                cases.append(Case(name, False, first))
    return cases


def test_cases(policy: CompiledPolicy, principal: str) -> list[Case]:
    """The policy's `tests:` file: one {"command", "principal"?, "cwd"?, "decision", "rule"?}
    per line, each evaluated through the decision stages."""
    if policy.tests is None:
        return []
    cases: list[Case] = []
    for n, line in enumerate(policy.tests.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            spec = json.loads(line)
            cwd = policy.workspace / spec["cwd"] if "cwd" in spec else None
            got = evaluate(policy, spec["command"], spec.get("principal", principal), cwd).decision
        except (ValueError, KeyError) as exc:
            cases.append(Case(f"{policy.tests.name}:{n}", False, f"bad test line: {exc}"))
            continue
        ok = got.verdict.label == spec["decision"] and ("rule" not in spec or got.rule == spec["rule"])
        detail = "" if ok else f"expected {spec['decision']} ({spec.get('rule')}), got {got.verdict.label} ({got.rule})"
        cases.append(Case(f"{policy.tests.name}:{n} {spec['command']!r}", ok, detail))
    return cases
