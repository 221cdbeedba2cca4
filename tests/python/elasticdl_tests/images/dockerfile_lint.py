"""A small Dockerfile parser and linter, for Dockerfiles no engine here can build (GPU) and
for catching mistakes before a slow build.

Checks: known instructions only; a FROM, with only ARG before the first one; every ``$VAR``
used by FROM declared by an ARG before it; every ARG used somewhere; an ARG declared before
FROM but used inside a stage must be re-declared in that stage (Docker's scoping rule, a
classic silent bug); COPY/ADD have a source and a destination; JSON (exec) forms parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

INSTRUCTIONS = {
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-+]([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line where it starts
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    if buf:
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    return out


def _vars(text: str) -> set[str]:
    """Names referenced, also inside another's default or alternative (${A:+$B})."""
    names: set[str] = set()
    for braced, inner, plain in _VAR.findall(text):
        names.add(braced or plain)
        if inner:
            names |= _vars(inner)
    return names


def lint(text: str) -> list[str]:
    """Problems as ``line N: message``; empty when the Dockerfile looks right."""
    problems: list[str] = []
    instructions = parse(text)
    global_args: set[str] = set()
    declared: dict[str, int] = {}
    used: set[str] = set()
    stage_args: set[str] | None = None  # None: before the first FROM

    for ins in instructions:
        where = f"line {ins.line}"
        if ins.keyword not in INSTRUCTIONS:
            problems.append(f"{where}: unknown instruction {ins.keyword}")
            continue
        if ins.keyword == "ARG":
            name = ins.args.split("=", 1)[0].strip()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                problems.append(f"{where}: bad ARG name {name!r}")
                continue
            declared.setdefault(name, ins.line)
            if stage_args is None:
                global_args.add(name)
            else:
                stage_args.add(name)
            continue
        if stage_args is None and ins.keyword != "FROM":
            problems.append(
                f"{where}: {ins.keyword} before the first FROM (only ARG may come first)"
            )
            continue
        refs = _vars(ins.args)
        used |= refs
        if ins.keyword == "FROM":
            for v in sorted(refs - global_args):
                problems.append(
                    f"{where}: FROM uses ${v}, not declared by an ARG before the first FROM"
                )
            stage_args = set()
            continue
        env_names = set()
        if ins.keyword == "ENV":
            env_names = {p.split("=", 1)[0] for p in ins.args.split() if "=" in p}
        for v in sorted((refs & global_args) - stage_args - env_names):
            problems.append(
                f"{where}: ${v} is an ARG of the global scope; re-declare it (ARG {v}) inside the stage"
            )
        if ins.keyword in ("COPY", "ADD"):
            parts = [p for p in ins.args.split() if not p.startswith("--")]
            if ins.args.startswith("["):
                try:
                    parts = json.loads(ins.args)
                except ValueError:
                    problems.append(f"{where}: {ins.keyword} JSON form does not parse")
            if len(parts) < 2:
                problems.append(f"{where}: {ins.keyword} needs a source and a destination")
        if ins.keyword in ("CMD", "ENTRYPOINT", "RUN", "SHELL") and ins.args.startswith("["):
            try:
                value = json.loads(ins.args)
                if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
                    raise ValueError
            except ValueError:
                problems.append(f"{where}: {ins.keyword} exec form must be a JSON list of strings")

    if not any(i.keyword == "FROM" for i in instructions):
        problems.append("line 1: no FROM instruction")
    for name, line in sorted(declared.items(), key=lambda kv: kv[1]):
        if name not in used:
            problems.append(f"line {line}: ARG {name} is never used")
    return problems
