"""The job spec: every parameter of an ElasticDL job, defined once.

:class:`JobSpec` is a frozen dataclass; each field carries its type, default, help text,
flag group, the commands that take it, and its check. Everything else is derived from it:

* ``elasticdl train|evaluate|predict`` flags are generated from the fields
  (:func:`add_job_flags`), with the same names and defaults as the original ElasticDL;
* ``elasticdl.api.train(spec)`` or ``api.train(job_name=..., ...)`` builds it directly;
* the client validates it once (:meth:`JobSpec.resolve`) and hands it to the master as JSON
  (one argument or one file: :func:`master_argv`);
* the master derives the PS and worker specs from it (``elasticdl.common.replica_spec``).

The modules, one seam each: ``fields`` (the field table), ``checks`` (one field),
``values``, ``resources``, ``volumes`` (values inside string fields), ``resolve`` (derived
defaults, fields against each other), ``local_paths`` (paths on the submitting machine),
``retired`` (flags of the original that are gone), ``flags`` (argparse and keyword arguments),
``master_argv`` (the master's command line). Import the names from here.

Standard library only: the light client imports this to print ``--help``.
"""

from elasticdl.common.job_dir import CHECKPOINT_SUBDIR, default_job_dir, elasticdl_home, jobs_root
from elasticdl.common.job_spec.checks import AUX_PARAMS, MAX_JOB_NAME_LENGTH, image_in_prefix
from elasticdl.common.job_spec.fields import (
    ALLREDUCE_BACKENDS,
    DEFAULT_EXTRA_PYPI_INDEX,
    DEFAULT_MASTER_PORT,
    EVALUATE,
    FIELDS,
    IMAGE_PULL_POLICIES,
    JOB_COMMANDS,
    LOG_LEVELS,
    POD_SECURITY_MODES,
    POD_SECURITY_NONE,
    POD_SECURITY_RESTRICTED,
    PREDICT,
    RESTART_POLICIES,
    TRAIN,
    JobSpec,
)
from elasticdl.common.job_spec.flags import (
    add_job_flags,
    command_fields,
    given_values,
    spec_fields,
    spec_from_text,
    spec_from_values,
)
from elasticdl.common.job_spec.local_paths import check_model_zoo, prebuilt_model_zoo
from elasticdl.common.job_spec.master_argv import master_argv, spec_from_master_argv
from elasticdl.common.job_spec.resolve import (
    POD_CHECKPOINT_DIR,
    default_checkpoint_dir,
    infer_job_type,
)
from elasticdl.common.job_spec.retired import RETIRED_FLAGS, RetiredFlag, check_retired
from elasticdl.common.job_spec.values import (
    aux_param_set,
    env_name_patterns,
    parse_envs,
    parse_pull_secrets,
    parse_secret_envs,
)
from elasticdl.common.spec_codec import SpecError, parse_bool

__all__ = [
    "ALLREDUCE_BACKENDS",
    "AUX_PARAMS",
    "CHECKPOINT_SUBDIR",
    "DEFAULT_EXTRA_PYPI_INDEX",
    "DEFAULT_MASTER_PORT",
    "EVALUATE",
    "FIELDS",
    "IMAGE_PULL_POLICIES",
    "JOB_COMMANDS",
    "JobSpec",
    "LOG_LEVELS",
    "MAX_JOB_NAME_LENGTH",
    "POD_CHECKPOINT_DIR",
    "POD_SECURITY_MODES",
    "POD_SECURITY_NONE",
    "POD_SECURITY_RESTRICTED",
    "PREDICT",
    "RESTART_POLICIES",
    "RETIRED_FLAGS",
    "RetiredFlag",
    "SpecError",
    "TRAIN",
    "add_job_flags",
    "aux_param_set",
    "check_model_zoo",
    "check_retired",
    "command_fields",
    "default_checkpoint_dir",
    "default_job_dir",
    "elasticdl_home",
    "env_name_patterns",
    "given_values",
    "image_in_prefix",
    "infer_job_type",
    "jobs_root",
    "master_argv",
    "parse_bool",
    "parse_envs",
    "parse_pull_secrets",
    "parse_secret_envs",
    "prebuilt_model_zoo",
    "spec_fields",
    "spec_from_master_argv",
    "spec_from_text",
    "spec_from_values",
]
