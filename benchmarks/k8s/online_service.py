"""A high-priority online service for the co-location experiment: a Deployment of a tiny HTTP
server (the job's image: Python's standard library) that answers only requests carrying its
bearer token, and a bounded load generator on this machine that calls its pods' addresses
(routed on this machine's bridges to the cluster's pod network; nothing leaves the machine).

The token is generated here and handed to the pods through a Secret; a request without it
gets 401.
"""

from __future__ import annotations

import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

NAME = "online-service"
PORT = 8080
SERVER = (
    """
import hmac, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
TOKEN = ("Bearer " + os.environ["SERVICE_TOKEN"]).encode()
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        given = self.headers.get("Authorization", "").encode()
        ok = hmac.compare_digest(given, TOKEN)
        body = b"ok\\n" if ok else b"unauthorized\\n"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("", %d), Handler).serve_forever()
"""
    % PORT
)


def manifests(namespace: str, image: str, cpu: str, token: str) -> tuple[dict, dict]:
    """(Secret, Deployment with 0 replicas) of the service, priority class elasticdl-high."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": NAME, "namespace": namespace},
        "stringData": {"token": token},
    }
    resources = {"cpu": cpu, "memory": "64Mi"}
    labels = {"app": NAME}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": "elasticdl-high",
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                    },
                    "containers": [
                        {
                            "name": "http",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-c", SERVER],
                            "env": [
                                {
                                    "name": "SERVICE_TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": NAME, "key": "token"}},
                                }
                            ],
                            "ports": [{"containerPort": PORT}],
                            "resources": {"requests": resources, "limits": resources},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }
    return secret, deployment


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class LoadGenerator:
    """Calls every Running pod of the service in turn at ``rate`` requests per second at most
    (one thread: bounded), counting answers by status; a request without the token is sent
    once per pass to check it is refused."""

    core: object
    namespace: str
    token: str
    rate: float = 20.0
    counts: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "LoadGenerator":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _get(self, ip: str, token: str | None) -> str:
        request = urllib.request.Request(f"http://{ip}:{PORT}/")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return str(response.status)
        except urllib.error.HTTPError as e:
            return str(e.code)
        except OSError:
            return "error"

    def _run(self) -> None:
        while not self._stop.is_set():
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"app={NAME}")
            ips = [
                p.status.pod_ip
                for p in pods.items
                if p.status.phase == "Running"
                and p.status.pod_ip
                and not p.metadata.deletion_timestamp
            ]
            if not ips:
                self._stop.wait(0.5)
                continue
            self._count("unauthenticated_" + self._get(ips[0], None))
            for ip in ips * max(1, int(self.rate) // len(ips)):
                if self._stop.is_set():
                    break
                t0 = time.monotonic()
                self._count(self._get(ip, self.token))
                self._stop.wait(max(0.0, 1.0 / self.rate - (time.monotonic() - t0)))
