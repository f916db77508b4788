#!/usr/bin/env python3
"""A CycloneDX 1.5 JSON SBOM of the crates the snapdrain binary links, from the dependency graph cargo
resolves offline (no registry is asked).

    cargo tree --locked --offline -p snapdrain-cli --no-default-features -e normal,no-proc-macro \
        --target x86_64-unknown-linux-gnu --prefix depth --format '{p}\t{l}\t{r}' \
      | sbom.py Cargo.lock VERSION REVISION EPOCH > snapdrain.cdx.json

Normal dependencies only, proc macros left out: build scripts and macros run at build time and are
not in the binary. Hashes are Cargo.lock's checksums (SHA-256 of the .crate file the registry served).
"""

import json
import re
import sys
import tomllib
import uuid
from datetime import datetime, timezone

# "3tokio v1.54.1 (*)\tMIT\thttps://..." : depth, name, version, optional (path) or (*), license, repo.
LINE = re.compile(r"^(\d+)(\S+) v(\S+)((?: \([^)]*\))*)\t([^\t]*)\t(.*)$")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    lock_path, version, revision, epoch = sys.argv[1:]
    with open(lock_path, "rb") as f:
        lock = tomllib.load(f)
    checksums = {
        (p["name"], p["version"]): p["checksum"] for p in lock.get("package", []) if "checksum" in p
    }

    components = {}
    edges = {}
    stack = []
    root = None
    for raw in sys.stdin.read().splitlines():
        if not raw.strip():
            continue
        m = LINE.match(raw)
        if not m:
            sys.exit(f"sbom.py: unexpected cargo tree line: {raw!r}")
        depth, name, ver, tail, license_expr, repo = m.groups()
        depth = int(depth)
        ref = f"{name}@{ver}"
        local = "(/" in tail
        if depth == 0:
            root = ref
        comp = components.setdefault(ref, {"name": name, "version": ver})
        if depth > 0:
            comp["type"] = "library"
        if license_expr:
            # Older crates write "MIT/Apache-2.0"; SPDX (which CycloneDX expects) says "MIT OR Apache-2.0".
            comp["license"] = " OR ".join(p.strip() for p in license_expr.split("/"))
        if repo:
            comp["repo"] = repo
        comp["local"] = local
        del stack[depth:]
        if stack:
            edges.setdefault(stack[-1], set()).add(ref)
        stack.append(ref)
        edges.setdefault(ref, set())
    if root is None:
        sys.exit("sbom.py: cargo tree printed no package")

    def component(ref):
        c = components[ref]
        out = {
            "type": c.get("type", "application"),
            "bom-ref": ref,
            "name": c["name"],
            "version": c["version"],
            "purl": f"pkg:cargo/{c['name']}@{c['version']}",
        }
        if c.get("license"):
            out["licenses"] = [{"expression": c["license"]}]
        digest = checksums.get((c["name"], c["version"]))
        if digest and not c["local"]:
            out["hashes"] = [{"alg": "SHA-256", "content": digest}]
        if c.get("repo"):
            out["externalReferences"] = [{"type": "vcs", "url": c["repo"]}]
        return out

    root_component = component(root)
    root_component["version"] = version
    if revision != "unknown":
        root_component["properties"] = [{"name": "git:revision", "value": revision}]
    stamp = datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        # Derived from what is described, so the same commit gives the same document.
        "serialNumber": "urn:uuid:" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"snapdrain/{version}/{revision}")),
        "version": 1,
        "metadata": {
            "timestamp": stamp,
            "tools": {"components": [{"type": "application", "name": "cargo tree"}]},
            "component": root_component,
        },
        "components": [component(r) for r in sorted(components) if r != root],
        "dependencies": [
            {"ref": r, "dependsOn": sorted(edges[r])} for r in sorted(edges)
        ],
    }
    json.dump(bom, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
