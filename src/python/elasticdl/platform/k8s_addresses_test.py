import pytest
from elasticdl.k8s.names import NETWORK_HOST, NETWORK_POD
from elasticdl.platform.base import PlatformError, ReplicaType
from elasticdl.platform.k8s_addresses import ReplicaAddresses

PS0 = (ReplicaType.PS, 0)
WORKER1 = (ReplicaType.WORKER, 1)


def test_pod_network_addresses_are_service_names_on_fixed_ports():
    a = ReplicaAddresses("job", "ns", NETWORK_POD, "10.1.2.3")
    assert a.address(PS0).endswith(":2222") and ".ns.svc" in a.address(PS0)
    assert a.address(WORKER1).endswith(":3333")


def test_host_network_ports_are_distinct_and_kept():
    a = ReplicaAddresses("job", "ns", NETWORK_HOST, "127.0.0.1")
    first = a.address(PS0)
    assert first.startswith("127.0.0.1:") and a.address(PS0) == first
    assert a.address(WORKER1) != first


def test_a_port_a_spec_names_wins_only_when_none_was_chosen():
    a = ReplicaAddresses("job", "ns", NETWORK_HOST, "127.0.0.1")
    a.keep_port(PS0, 40001)
    a.keep_port(PS0, 40002)
    assert a.address(PS0) == "127.0.0.1:40001"


def test_reserve_keeps_a_previous_masters_address_and_refuses_bad_ones():
    a = ReplicaAddresses("job", "ns", NETWORK_HOST, "127.0.0.1")
    a.reserve(PS0, "127.0.0.1:41000")
    assert a.address(PS0) == "127.0.0.1:41000"
    with pytest.raises(PlatformError, match="has no port"):
        a.reserve(PS0, "127.0.0.1")
    with pytest.raises(PlatformError, match="not on this node"):
        a.reserve(PS0, "10.9.9.9:41000")
