"""--volume strings: the keys, one-line errors."""

import pytest
from elasticdl.common.job_spec.volumes import VolumeError, parse_volumes


def test_empty():
    assert parse_volumes("") == []


@pytest.mark.parametrize(
    "bad, message",
    [
        ("claim_name=c1,mount_path=/p,abc=1", "unknown key 'abc'"),
        ("claim_name=c1,claim_name=c2,mount_path=/p", "key 'claim_name' appears twice"),
        ("claim_name=c1", "needs mount_path"),
        ("mount_path=/p", "needs claim_name=<pvc> or host_path=<dir>"),
        ("claim_name=c1,host_path=/h,mount_path=/p", "both claim_name and host_path"),
        ("claim_name=c1,mount_path=p", "must be absolute"),
        ("claim_name=c1,mount_path=/p,type=Directory", "host_path volumes only"),
        ("host_path=/h,mount_path=/p,type=Dir", "type 'Dir'"),
        ("claim_name=c1,mount_path=/p;claim_name=c2,mount_path=/p", "used by two volumes"),
        ("claim_name=,mount_path=/p", "has no value"),
        ("claim_name=c1,mount_path", "is not key=value"),
        ("claim_name=c1,mount_path=/p,read_only=maybe", "use true or false"),
        ("secret_name=s,host_path=/h,mount_path=/p", "both host_path and secret_name"),
        ("secret_name=Job_TLS,mount_path=/p", "is not a Secret name"),
        ("secret_name=s,mount_path=/p,type=File", "host_path volumes only"),
    ],
)
def test_errors(bad, message):
    with pytest.raises(VolumeError, match=message):
        parse_volumes(bad)
