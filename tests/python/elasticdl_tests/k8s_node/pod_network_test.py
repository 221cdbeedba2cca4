"""The real cluster's pod network (``scripts/k8s/start-node.sh``): pods on different nodes, each
in its own network namespace with an address of its node's pod range, reach each other by
Service DNS names -- a headless Service (endpoint addresses) and a ClusterIP Service
(kube-proxy's rules) -- and reach the apiserver through the ``kubernetes`` Service with their
service-account token, as on any cluster; a hostPort is served on its node's bridge address
only; nothing leaves the machine.

Stand-ins (scripts/k8s/README.md): the cluster DNS server is Debian's dnsmasq, fed from the API
(Services and Endpoints watched) by ``scripts/k8s/cluster-dns.py``: it stands in for CoreDNS,
which Debian does not package and which cannot be fetched here. NetworkPolicy objects are
stored but nothing enforces them (no policy agent can be installed).
"""

from __future__ import annotations

import json
import random
import socket
import urllib.request
import uuid

from elasticdl_tests.k8s_node import cluster_objects as objects
from elasticdl_tests.k8s_node.base_image import node_script
from elasticdl_tests.k8s_node.node import repo_root

# Retried: a client may start before the server is Ready and its DNS record exists.
FETCH = 'for i in $(seq 60); do wget -qO- -T 2 "$0" && exit 0; sleep 1; done; exit 1'


def _pod_range(cluster, node: str) -> str:
    """Node i's pod range <A.B>.i.0/24, as its prefix "<A.B>.i."."""
    return f"{cluster.range_prefix}.{cluster.nodes.index(node) + 1}."


def test_pods_on_two_nodes_reach_each_other_by_service_names(k8s_node, node_namespace, tmp_path):
    cluster, ns = k8s_node, node_namespace
    assert len(cluster.nodes) >= 2, cluster.nodes
    server_node, client_node = cluster.nodes[1], cluster.nodes[0]
    page = uuid.uuid4().hex
    objects.apply(
        cluster,
        ns,
        f"""
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{clusterIP: None, selector: {{app: web}}, ports: [{{port: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-ip}}
spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, labels: {{app: web}}}}
spec:
  nodeName: "{server_node}"
  hostname: web-0
  subdomain: web
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {objects.BUSYBOX}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "mkdir -p /w && echo {page} > /w/index.html && exec httpd -f -p 8080 -h /w"]
---
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  nodeName: "{client_node}"
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {objects.BUSYBOX}, imagePullPolicy: Never, command: {json.dumps(objects.SLEEPER)}}}]
""",
        tmp_path,
    )
    web = objects.running(cluster, ns, "web")
    client = objects.running(cluster, ns, "client")
    # Two nodes, two network namespaces, each address in its node's pod range.
    assert (web["spec"]["nodeName"], client["spec"]["nodeName"]) == (server_node, client_node)
    assert web["status"]["podIP"].startswith(_pod_range(cluster, server_node)), web["status"]
    assert client["status"]["podIP"].startswith(_pod_range(cluster, client_node)), client["status"]
    cluster_ip = json.loads(cluster.kubectl("get", "svc", "web-ip", "-n", ns, "-o", "json"))
    cluster_ip = cluster_ip["spec"]["clusterIP"]

    names = {
        "http://web:8080/": "the headless Service, short name (search list)",
        f"http://web.{ns}.svc.cluster.local:8080/": "the headless Service",
        f"http://web-0.web.{ns}.svc.cluster.local:8080/": "the pod's hostname.subdomain",
        "http://web-ip/": "the ClusterIP Service, short name",
        f"http://web-ip.{ns}.svc:80/": "the ClusterIP Service, as ElasticDL names Services",
        f"http://{cluster_ip}/": "the ClusterIP itself",
    }
    for url, what in names.items():
        got = cluster.kubectl(
            "exec", "-n", ns, "client", "--", "sh", "-c", FETCH, url, timeout=90, check=False
        )
        assert got.strip() == page, f"{what} ({url}) from {client_node}: {got!r}"

    # What the DNS server answers: the endpoint's address for the headless name, the ClusterIP
    # for the other; a name outside the cluster's domain is refused (no upstream).
    lookup = objects.sh(cluster, ns, "client", f"nslookup web.{ns}.svc.cluster.local")
    assert web["status"]["podIP"] in lookup, lookup
    lookup = objects.sh(cluster, ns, "client", f"nslookup web-ip.{ns}.svc.cluster.local")
    assert cluster_ip in lookup, lookup
    outside = objects.sh(cluster, ns, "client", "nslookup deb.debian.org 2>&1; echo exit=$?")
    assert "REFUSED" in outside and "exit=1" in outside, outside


def test_pods_have_no_route_off_the_machine(k8s_node, node_namespace, tmp_path):
    cluster, ns = k8s_node, node_namespace
    objects.apply(
        cluster,
        ns,
        f"""
apiVersion: v1
kind: Pod
metadata: {{name: probe}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {objects.BUSYBOX}, imagePullPolicy: Never, command: {json.dumps(objects.SLEEPER)}}}]
""",
        tmp_path,
    )
    objects.running(cluster, ns, "probe")
    routes = objects.sh(cluster, ns, "probe", "ip route")
    assert "default" not in routes, routes
    # 203.0.113.0/24 is TEST-NET-3: the pod's kernel refuses at once, nothing is sent.
    out = objects.sh(cluster, ns, "probe", "wget -qO- -T 2 http://203.0.113.1/ 2>&1; echo exit=$?")
    assert "Network is unreachable" in out and "exit=1" in out, out


def test_a_host_port_is_served_on_its_nodes_bridge_address_only(k8s_node, node_namespace, tmp_path):
    cluster, ns = k8s_node, node_namespace
    node = cluster.nodes[-1]
    host_port = random.randint(30000, 32000)
    page = uuid.uuid4().hex
    objects.apply(
        cluster,
        ns,
        f"""
apiVersion: v1
kind: Pod
metadata: {{name: ported}}
spec:
  nodeName: "{node}"
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {objects.BUSYBOX}
    imagePullPolicy: Never
    ports: [{{containerPort: 8080, hostPort: {host_port}}}]
    command: ["/bin/sh", "-c", "mkdir -p /w && echo {page} > /w/index.html && exec httpd -f -p 8080 -h /w"]
""",
        tmp_path,
    )
    objects.running(cluster, ns, "ported")
    bridge = _pod_range(cluster, node) + "1"  # the node's pod bridge (the pods' gateway)
    with urllib.request.urlopen(f"http://{bridge}:{host_port}/", timeout=10) as r:
        assert r.read().decode().strip() == page
    # Not on the node's own name (127.0.0.i), nor any other address of the machine.
    for address in (node, "127.0.0.1"):
        with socket.socket() as s:
            s.settimeout(5)
            assert s.connect_ex((address, host_port)) != 0, f"{address}:{host_port} answered"


API_CALL = r"""
import json, os, ssl, urllib.error, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
ns = open(sa + "namespace").read()
url = f"https://{host}:{port}/api/v1/namespaces/{ns}/pods/{os.environ['POD_NAME']}"
context = ssl.create_default_context(cafile=sa + "ca.crt")  # verifies the apiserver's name
def get(headers):
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as r:
            return r.status, json.load(r)["metadata"]["name"]
    except urllib.error.HTTPError as e:
        return e.code, json.load(e).get("reason")
token = open(sa + "token").read()
print(json.dumps({"host": host, "port": port,
                  "with_token": get({"Authorization": "Bearer " + token}), "without": get({})}))
"""


def test_pods_reach_the_apiserver_through_the_kubernetes_service(
    k8s_node, node_namespace, tmp_path
):
    """With the variables Kubernetes injects (no override), the service-account token and CA:
    from a pod on the pod network and from a host-network pod."""
    cluster, ns = k8s_node, node_namespace
    image = node_script(cluster, repo_root(), "base-image")  # Debian + python3, node 1's engine
    kubernetes = json.loads(
        cluster.kubectl("get", "svc", "kubernetes", "-n", "default", "-o", "json")
    )
    service_ip = kubernetes["spec"]["clusterIP"]
    pods = ""
    for name, host_network in (("api-pod", "false"), ("api-host", "true")):
        pods += f"""
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeName: "{cluster.nodes[0]}"
  hostNetwork: {host_network}
  restartPolicy: Never
  containers:
  - name: c
    image: {image}
    imagePullPolicy: Never
    env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
    command: ["python3", "-c", {json.dumps(API_CALL)}]
"""
    objects.apply(
        cluster,
        ns,
        f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: read-pods}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: read-pods}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-pods}}
subjects: [{{kind: ServiceAccount, name: default, namespace: {ns}}}]
{pods}""",
        tmp_path,
    )
    for name in ("api-pod", "api-host"):
        done = objects.ended(cluster, ns, name)
        log = cluster.kubectl("logs", "-n", ns, name, check=False)
        assert done["status"]["phase"] == "Succeeded", f"{name}: {log}"
        answer = json.loads(log.strip().splitlines()[-1])
        # The injected address is the `kubernetes` Service's ClusterIP (kube-proxy's rules lead
        # it to the apiserver); the token is authenticated and authorized for its own pod; no
        # token is refused (anonymous requests are off).
        assert (answer["host"], answer["port"]) == (service_ip, "443"), answer
        assert answer["with_token"] == [200, name], answer
        assert answer["without"] == [401, "Unauthorized"], answer
