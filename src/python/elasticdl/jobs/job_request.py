"""The job server's submit body (``POST /v1/jobs``): the one type the client sends and the
server reads (its route takes it as the request body; FastAPI checks it)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobRequest:
    """The job spec's fields (``elasticdl.common.job_spec.JobSpec``, by flag name) and what
    the job runs: an uploaded package, or (Kubernetes) an image."""

    # How the server's web framework validates it: unknown fields are errors.
    __pydantic_config__: ClassVar[dict] = {"extra": "forbid"}
    # Spec fields that name things on the client's machine: the server decides them.
    CLIENT_FIELDS: ClassVar[tuple[str, ...]] = ("model_zoo", "platform", "job_dir")

    command: str = "train"
    spec: dict[str, Any]
    package: str = ""
    image: str = ""

    @classmethod
    def of(
        cls, spec: Any, command: str = "train", package: str = "", image: str = ""
    ) -> "JobRequest":
        """The request for ``spec`` (a ``JobSpec`` or a dict of its fields), without the
        fields only the client's machine knows; its data and output paths are paths in the
        user's data directory on the server."""
        fields: Mapping[str, Any] = (
            spec if isinstance(spec, Mapping) else spec.to_dict(only_changed=True)
        )
        kept = {k: v for k, v in fields.items() if k not in cls.CLIENT_FIELDS}
        return cls(command=command, spec=kept, package=package, image=image)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"command": self.command, "spec": self.spec, "package": self.package}
        if self.image:
            body["image"] = self.image
        return body
