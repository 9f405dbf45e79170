"""Program models: what each program does with the words of its argv (docs/policy.md,
"Program models"). One YAML file per program in this directory, validated by schema.py, each
with examples that are checked when the models load; argv.py reads a command through its model.

`model_for(name)` is the model for a program name (or an absolute path's last component), or
None. The models load once, on first use; a broken model is an error that stops the policy from
loading (gateway/policy/compile.py asks for them), never a model silently missing.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from gateway.analysis import Command, analyze
from gateway.programs.argv import Reading, read
from gateway.programs.schema import Example, ProgramModel
from gateway.strict_yaml import YamlError, describe_errors, read_yaml

DIRECTORY = Path(__file__).resolve().parent

__all__ = [
    "DIRECTORY",
    "ProgramModelError",
    "Reading",
    "load_models",
    "model_for",
    "models",
    "models_subcommand",
    "never_options_from",
    "read",
    "reading_of",
]


class ProgramModelError(Exception):
    """A model file that cannot be used; the message names the file and line."""


def load_models(directory: Path = DIRECTORY) -> dict[str, ProgramModel]:
    """Every model in `directory`, by each name it applies to; examples checked."""
    out: dict[str, ProgramModel] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            data, positions = read_yaml(path, fast=True, what="the program model")
        except YamlError as exc:
            raise ProgramModelError(str(exc)) from None
        try:
            model = ProgramModel.model_validate(data)
        except ValidationError as exc:
            raise ProgramModelError(describe_errors(path, exc, positions)) from None
        if path.stem != model.program:
            raise ProgramModelError(f"{path}:1:1: program: {model.program!r} must be the file's name ({path.stem})")
        problems = [f"{path}:{positions.get(('examples', i), (1, 1))[0]}: examples[{i}]: {p}"
                    for i, ex in enumerate(model.examples) if (p := check_example(model, ex))]  # fmt: skip
        if problems:
            raise ProgramModelError("\n".join(problems))
        for name in (model.program, *model.names):
            if name in out:
                raise ProgramModelError(f"{path}: {name!r} is already modelled by {out[name].program}.yaml")
            out[name] = model
    return out


def check_example(model: ProgramModel, ex: Example) -> str:
    """Why the example fails ("" when the model reads the command as it says)."""
    analysis = analyze(ex.command, second_opinion_enabled=False)
    if analysis.denial is not None or len(analysis.commands) < 1:
        return f"{ex.command!r}: the analyser denies it ({analysis.denial.code if analysis.denial else 'empty'})"
    cmd = analysis.commands[0]
    got = read(model, cmd)
    if bool(got.refused) != ex.refused:
        return f"{ex.command!r}: " + (f"refused ({got.refused})" if got.refused else "expected the model to refuse it")
    if got.refused:
        return ""
    if bool(got.runs) != ex.runs_code:
        return f"{ex.command!r}: runs code: got {list(got.runs)}, expected {ex.runs_code}"
    reads, writes = sorted(w.value for w in got.reads), sorted(w.value for w in got.writes)
    if reads != sorted(ex.read) or writes != sorted(ex.write):
        return (
            f"{ex.command!r}: got read {reads} write {writes}, expected read {sorted(ex.read)} write {sorted(ex.write)}"
        )
    taken = got.to_json()
    for key, wanted in (("patterns", ex.patterns), ("scripts", ex.scripts)):
        missing = [w for w in wanted if w not in taken[key]]
        if missing:
            return f"{ex.command!r}: {missing} not taken as {key} (got {taken[key]})"
    return ""


@lru_cache(maxsize=1)
def models() -> dict[str, ProgramModel]:
    """The shipped models (loaded once)."""
    return load_models()


def model_for(program: str) -> ProgramModel | None:
    return models().get(os.path.basename(program))


def models_subcommand(cmd: Command) -> bool:
    """Does the program's model read `cmd`'s subcommand (argv[1]), or have no subcommands?
    A rule naming subcommands reads a command through the model only then; a subcommand the
    model does not list is matched on its words, as before models had subcommands."""
    model = model_for(cmd.program) if cmd.argv else None
    if model is None or not model.subcommands:
        return True
    return len(cmd.argv) > 1 and cmd.argv[1].literal and model.subcommand(cmd.argv[1].value) is not None


@lru_cache(maxsize=4096)
def reading_of(cmd: Command) -> Reading | None:
    """`cmd` read through its program's model, or None when the program has none."""
    model = model_for(cmd.program) if cmd.argv else None
    return read(model, cmd) if model is not None else None


def never_options_from(cmd: Command) -> int | None:
    """The argv index from which no word of `cmd` is an option to its program, as its model reads
    it, or None: every word of a program whose words are all values (echo, ps, kill), the words
    after the first operand of a program that does not permute (printf's arguments after the
    format, awk's files after the program), the words after `--`. A glob there may match a file
    named like an option: the program takes it as an argument (pathjail.py)."""
    model = model_for(cmd.program) if cmd.argv else None
    if model is None:
        return None
    if model.grammar == "words":
        return 1
    reading = reading_of(cmd)
    if reading is None or reading.refused:
        return None
    found: list[int] = [r.index + 1 for r in reading.roles if r.kind == "end_of_options"][:1]
    if not model.permutes and not model.subcommands and reading.operands:
        found.append(reading.operands[0] + 1)
    return min(found) if found else None
