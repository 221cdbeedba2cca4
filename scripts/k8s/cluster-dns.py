#!/usr/bin/env python3
"""The cluster's DNS records, mirrored from the Kubernetes API into a hosts file for dnsmasq.

It stands in for CoreDNS, which Debian does not package (and nothing may be fetched from
elsewhere): Debian's dnsmasq serves the file from ``--hostsdir``, re-reading it by itself
(inotify) whenever a file there is replaced. The records, one ``IP name`` line each:

  ``<svc>.<ns>.svc.<domain>``             a Service's ClusterIP; for a headless Service every
                                          ready endpoint address (and the not-ready ones when
                                          the Service publishes them)
  ``<hostname>.<svc>.<ns>.svc.<domain>``  an endpoint with a hostname of a headless Service (a
                                          pod whose spec.hostname / spec.subdomain name it)

ExternalName Services get no record (a hosts file cannot hold a CNAME); no SRV records.

Services and Endpoints are watched; an event only marks the records stale, and the main loop
then lists both and writes the whole file (a small cluster: cheap, and the file never depends
on the order of events), at least every 30 s. The file is written beside the directory and
renamed into it, so dnsmasq never reads half a file. Standard library only. The token needs
get/list/watch on services and endpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import threading
import time
import urllib.request

RELIST_S = 30
WATCH_S = 300


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


class Api:
    def __init__(self, url: str, token_file: str, ca_file: str) -> None:
        self.url = url.rstrip("/")
        with open(token_file) as f:
            self.token = f.read().strip()
        self.context = ssl.create_default_context(cafile=ca_file)

    def open(self, path: str, timeout: float):
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": "Bearer " + self.token}
        )
        return urllib.request.urlopen(request, context=self.context, timeout=timeout)

    def items(self, resource: str) -> list[dict]:
        with self.open(f"/api/v1/{resource}", timeout=15) as r:
            return json.load(r)["items"]


def watch(api: Api, resource: str, stale: threading.Event) -> None:
    """Mark the records stale on every change of `resource`; reconnects forever."""
    while True:
        try:
            with api.open(f"/api/v1/{resource}?limit=1", timeout=15) as r:
                version = json.load(r)["metadata"]["resourceVersion"]
            stale.set()  # whatever changed while no watch was open
            path = (
                f"/api/v1/{resource}?watch=1&resourceVersion={version}"
                f"&timeoutSeconds={WATCH_S}&allowWatchBookmarks=true"
            )
            with api.open(path, timeout=WATCH_S + 30) as r:
                for line in r:
                    kind = json.loads(line).get("type")
                    if kind == "ERROR":  # e.g. 410 Gone: list again
                        break
                    if kind != "BOOKMARK":
                        stale.set()
        except Exception as e:  # the apiserver restarting, a timeout: try again
            log(f"watch {resource}: {type(e).__name__}: {e}")
            time.sleep(1)


def records(services: list[dict], endpoints: list[dict], domain: str) -> list[str]:
    lines = set()
    headless = {}
    for service in services:
        meta, spec = service["metadata"], service.get("spec") or {}
        name = f"{meta['name']}.{meta['namespace']}.svc.{domain}"
        cluster_ip = spec.get("clusterIP")
        if cluster_ip == "None":
            headless[(meta["namespace"], meta["name"])] = bool(spec.get("publishNotReadyAddresses"))
        elif cluster_ip:
            lines.add(f"{cluster_ip} {name}")
    for endpoint in endpoints:
        meta = endpoint["metadata"]
        key = (meta["namespace"], meta["name"])
        if key not in headless:
            continue
        name = f"{meta['name']}.{meta['namespace']}.svc.{domain}"
        for subset in endpoint.get("subsets") or []:
            addresses = list(subset.get("addresses") or [])
            if headless[key]:
                addresses += subset.get("notReadyAddresses") or []
            for address in addresses:
                lines.add(f"{address['ip']} {name}")
                if address.get("hostname"):
                    lines.add(f"{address['ip']} {address['hostname']}.{name}")
    return sorted(lines, key=lambda line: (line.split()[1], line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--api", required=True, help="the apiserver's URL")
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--ca-file", required=True)
    parser.add_argument("--hosts-dir", required=True, help="dnsmasq's --hostsdir")
    parser.add_argument("--domain", default="cluster.local")
    args = parser.parse_args(argv)

    api = Api(args.api, args.token_file, args.ca_file)
    hosts_dir = os.path.abspath(args.hosts_dir)
    os.makedirs(hosts_dir, exist_ok=True)
    target = os.path.join(hosts_dir, "cluster.hosts")
    scratch = os.path.join(os.path.dirname(hosts_dir), ".cluster.hosts.new")
    stale = threading.Event()
    for resource in ("services", "endpoints"):
        threading.Thread(target=watch, args=(api, resource, stale), daemon=True).start()
    written = None
    while True:
        stale.wait(timeout=RELIST_S)
        stale.clear()
        try:
            lines = records(api.items("services"), api.items("endpoints"), args.domain)
        except Exception as e:
            log(f"list: {type(e).__name__}: {e}")
            time.sleep(1)
            stale.set()
            continue
        text = "".join(line + "\n" for line in lines)
        if text == written:
            continue
        with open(scratch, "w") as f:
            f.write(text)
        os.chmod(scratch, 0o644)
        os.replace(scratch, target)  # dnsmasq sees the rename and reads the new file
        written = text
        log(f"wrote {len(lines)} records")


if __name__ == "__main__":
    sys.exit(main())
