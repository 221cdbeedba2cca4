"""The master's command line: the whole job spec in one argument or one file."""

from __future__ import annotations

import argparse

from elasticdl.common.job_spec.fields import JobSpec
from elasticdl.common.spec_codec import SpecError


class _MasterArgvParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise SpecError(message)


def master_argv(spec: JobSpec | None = None, spec_file: str = "") -> list[str]:
    """The master's arguments: ``--job_spec=JSON`` (only the fields that differ from their
    defaults, so a pod manifest stays readable) or ``--job_spec_file=PATH``."""
    if (spec is None) == (not spec_file):
        raise ValueError("give the master either a spec or a spec file")
    if spec_file:
        return [f"--job_spec_file={spec_file}"]
    return [f"--job_spec={spec.to_json(only_changed=True)}"]


def spec_from_master_argv(argv: list[str]) -> JobSpec:
    """Read what :func:`master_argv` wrote and resolve it (local paths are the client's to
    check). Raises :class:`SpecError` with a one-line message."""
    parser = _MasterArgvParser(prog="elasticdl master", allow_abbrev=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job_spec", help="The job spec as JSON")
    source.add_argument("--job_spec_file", help="A file holding the job spec as JSON")
    args = parser.parse_args(argv)
    text = args.job_spec
    if args.job_spec_file:
        try:
            with open(args.job_spec_file) as f:
                text = f.read()
        except OSError as e:
            raise SpecError(
                f"--job_spec_file: cannot read {args.job_spec_file}: {e.strerror}"
            ) from None
    spec, _ = JobSpec.from_json(text).resolve(check_local_paths=False)
    return spec
