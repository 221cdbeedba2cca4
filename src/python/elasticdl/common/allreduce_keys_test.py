from elasticdl.common import auth
from elasticdl.common.allreduce_keys import group_store_prefix


def test_store_prefix_differs_per_generation():
    assert group_store_prefix(1) != group_store_prefix(2)


def test_with_a_secret_the_prefix_starts_with_what_only_its_holders_can_derive():
    prefix = group_store_prefix(3, secret="s3cret")
    assert prefix == f"{auth.store_prefix('s3cret')}/{group_store_prefix(3)}"
    assert group_store_prefix(3, secret="other") != prefix
