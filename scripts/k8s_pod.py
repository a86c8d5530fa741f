#!/usr/bin/env python3
"""Turns the coordinator StatefulSet of deploy/k8s/coordinator.yaml into a Pod that `podman kube
play` runs (podman runs Pods, not StatefulSets): the pod template as it is, with the store's volume
claim template as a claim of its own, the Secret and the assets claim as host folders, and each
emptyDir named after the pod (podman makes a named volume of it).

    k8s_pod.py deploy/k8s/coordinator.yaml --image IMAGE --tls DIR --assets DIR > pod.yaml
"""
import argparse
import sys

import yaml


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("manifest")
    p.add_argument("--image", required=True)
    p.add_argument("--tls", required=True, help="folder holding server.pem, server.key, ca.pem")
    p.add_argument("--assets", required=True, help="folder holding models/ and data/")
    p.add_argument("--name", default="fedlora-coordinator-0")
    args = p.parse_args()
    with open(args.manifest, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    for c in spec["containers"]:
        c["image"] = args.image
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    volumes = []
    renamed = {}  # podman makes a named volume of an emptyDir: give it the pod's name
    for v in spec["volumes"]:
        if "emptyDir" in v:
            renamed[v["name"]] = f"{args.name}-{v['name']}"
            v = {"name": renamed[v["name"]], "emptyDir": v["emptyDir"]}
        elif "secret" in v:
            v = {"name": v["name"], "hostPath": {"path": args.tls, "type": "Directory"}}
        elif "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] == "fedlora-assets":
            v = {"name": v["name"], "hostPath": {"path": args.assets, "type": "Directory"}}
        volumes.append(v)
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            m["name"] = renamed.get(m["name"], m["name"])
    for claim in sorted(claims):  # what the StatefulSet controller would create: <claim>-<pod>
        volumes.append({"name": claim, "persistentVolumeClaim": {"claimName": f"{claim}-{args.name}"}})
    spec["volumes"] = volumes
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": args.name, "labels": sts["spec"]["template"]["metadata"]["labels"]},
        "spec": spec,
    }
    yaml.safe_dump(pod, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
