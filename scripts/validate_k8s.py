#!/usr/bin/env python3
"""Validates Kubernetes manifests against the API's JSON schema (kubernetes-validate, strict: an
unknown field is an error), for every Kubernetes version given with --versions.

    .venv-deploy/bin/python scripts/validate_k8s.py deploy/k8s/*.yaml
"""
import argparse
import sys

import kubernetes_validate
import yaml


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--versions", default="1.27.0,1.28.0", help="comma-separated Kubernetes versions")
    args = parser.parse_args()
    failures = 0
    documents = 0
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        for doc in docs:
            documents += 1
            name = f"{path}: {doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"
            for version in args.versions.split(","):
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    failures += 1
                    print(f"{name} (Kubernetes {version}): {e.message} at {'.'.join(map(str, e.path))}",
                          file=sys.stderr)
                except Exception as e:  # an unknown kind or version is a failure too
                    failures += 1
                    print(f"{name} (Kubernetes {version}): {e}", file=sys.stderr)
    print(f"validate_k8s: {documents} documents in {len(args.files)} files, {failures} problems")
    return 1 if failures or documents == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
