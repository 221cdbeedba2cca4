"""Pod volumes from --volume strings: claims, host paths and Secrets, shared volumes."""

from elasticdl.k8s.volumes import volumes_and_mounts


def test_claim_volume():
    volumes, mounts = volumes_and_mounts("claim_name=c1,mount_path=/path1")
    assert [v.to_dict() for v in volumes] == [
        {"name": "volume-0", "persistentVolumeClaim": {"claimName": "c1"}}
    ]
    assert [m.to_dict() for m in mounts] == [{"name": "volume-0", "mountPath": "/path1"}]


def test_host_path_volume_with_type_and_sub_path():
    volumes, mounts = volumes_and_mounts(
        " host_path=/h , mount_path=/q, type=Directory, sub_path=s "
    )
    assert volumes[0].to_dict() == {
        "name": "volume-0",
        "hostPath": {"path": "/h", "type": "Directory"},
    }
    assert mounts[0].to_dict() == {"name": "volume-0", "mountPath": "/q", "subPath": "s"}


def test_several_volumes_and_claim_reuse():
    volumes, mounts = volumes_and_mounts(
        "claim_name=c1,mount_path=/p1;claim_name=c1,mount_path=/p2,sub_path=x;"
        "host_path=/h,mount_path=/p3;claim_name=c2,mount_path=/p4,read_only=true;"
    )
    assert [v.name for v in volumes] == ["volume-0", "volume-1", "volume-2"]
    assert [(m.name, m.mount_path, m.sub_path) for m in mounts] == [
        ("volume-0", "/p1", ""),
        ("volume-0", "/p2", "x"),
        ("volume-1", "/p3", ""),
        ("volume-2", "/p4", ""),
    ]
    assert mounts[3].to_dict()["readOnly"] is True


def test_secret_volume_for_the_jobs_tls_files():
    volumes, mounts = volumes_and_mounts(
        "secret_name=job-tls,mount_path=/etc/elasticdl-tls;claim_name=c1,mount_path=/data"
    )
    assert volumes[0].to_dict() == {
        "name": "volume-0",
        "secret": {"secretName": "job-tls", "defaultMode": 0o440},
    }
    assert mounts[0].to_dict() == {"name": "volume-0", "mountPath": "/etc/elasticdl-tls"}
    assert volumes[1].to_dict()["persistentVolumeClaim"] == {"claimName": "c1"}


def test_empty():
    assert volumes_and_mounts("") == ([], [])
