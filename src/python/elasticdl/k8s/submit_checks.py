"""What the client asks the cluster before it submits a job (after the job spec's own checks):

* the job's PriorityClasses (:mod:`elasticdl.k8s.priority_classes`): unset priorities default
  to ElasticDL's classes where they exist; a class that does not exist is one line and
  nothing is submitted (the API server would refuse the pod later, in the master);
* the nodes (:mod:`elasticdl.k8s.node_fit`): a one-line warning per replica kind that no
  node's allocatable holds.

Whatever the client may not read (PriorityClasses and nodes are cluster-wide; RBAC may deny
them) it says nothing about and changes nothing for.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from elasticdl.k8s import node_fit, priority_classes
from elasticdl.k8s.api_errors import api_exception_class

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec

logger = logging.getLogger(__name__)


def class_reader(api_client) -> priority_classes.ClassExists:
    """``exists(name)``: True / False from the API server, None when it cannot be asked."""
    from kubernetes import client

    api = client.SchedulingV1Api(api_client)
    known: dict[str, bool | None] = {}

    def exists(name: str) -> bool | None:
        if name not in known:
            try:
                api.read_priority_class(name)
                known[name] = True
            except api_exception_class() as e:
                known[name] = False if e.status == 404 else None
                if e.status != 404:
                    logger.debug("cannot read PriorityClass %s: %s", name, e.status)
            except Exception as e:  # unreachable server: the submission says so itself
                logger.debug("cannot read PriorityClass %s: %s", name, e)
                known[name] = None
        return known[name]

    return exists


def readable_nodes(api_client) -> list:
    """The cluster's nodes, or [] when they cannot be listed."""
    from kubernetes import client

    try:
        return list(client.CoreV1Api(api_client).list_node().items)
    except Exception as e:  # forbidden (RBAC) or unreachable: no warning either way
        logger.debug("cannot list nodes: %s", e)
        return []


def check(job: "JobSpec", api_client) -> tuple["JobSpec", list[str]]:
    """The job to submit (priorities resolved) and the notices for the user. Raises
    :class:`~elasticdl.k8s.priority_classes.MissingPriorityClass`."""
    job, notices = priority_classes.resolve(job, class_reader(api_client))
    notices += node_fit.unfit_warnings(node_fit.replica_requests(job), readable_nodes(api_client))
    return job, notices
