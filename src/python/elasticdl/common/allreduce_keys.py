"""Where an AllReduce group keeps its keys in the store the master hosts.

The master serves one key-value store for the whole job (``master.rendezvous.RendezvousStore``)
and decides the generations; each worker builds the group of generation *g* through its own
view of that store, prefixed so that a group never meets the keys of an older generation and a
process without the job's secret cannot name them (``common.auth.store_prefix``).
"""

from __future__ import annotations

from elasticdl.common import auth

_GENERATION_PREFIX = "elasticdl/rendezvous/{generation}/"


def group_store_prefix(generation: int, secret: str = "") -> str:
    """The key prefix of generation ``generation``'s group (under the secret's prefix when the
    job has a secret)."""
    prefix = _GENERATION_PREFIX.format(generation=generation)
    return f"{auth.store_prefix(secret)}/{prefix}" if secret else prefix
