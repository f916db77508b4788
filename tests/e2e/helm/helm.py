#!/usr/bin/env python3
"""Real Helm (Helm 4 as a library: the helm-sdkpy package) for tests/e2e/helm.rs.

    helm.py KUBECONFIG NAMESPACE lint CHART
    helm.py KUBECONFIG NAMESPACE install RELEASE CHART VALUES_JSON
    helm.py KUBECONFIG NAMESPACE render RELEASE CHART VALUES_JSON
    helm.py KUBECONFIG NAMESPACE upgrade RELEASE CHART VALUES_JSON
    helm.py KUBECONFIG NAMESPACE uninstall RELEASE

Prints Helm's answer as one JSON document on stdout. A Helm error is printed on stderr, exit status 1;
a missing helm-sdkpy, exit status 3 (.ci/run installs it:
`pip install --ignore-requires-python helm-sdkpy`).
"""

import asyncio
import json
import sys

try:
    import helm_sdkpy as helm
except ImportError as e:
    print(
        f"helm-sdkpy is not installed ({e}): pip install --ignore-requires-python helm-sdkpy",
        file=sys.stderr,
    )
    sys.exit(3)

# Seconds for one action, waiting included; the Rust side bounds the whole process too.
TIMEOUT = 120


async def run(kubeconfig, namespace, action, args):
    config = helm.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    if action == "lint":
        (chart,) = args
        return await helm.Lint(config).run(chart)
    if action == "install":
        release, chart, values = args
        # wait: Helm's own readiness wait (the Deployment's replicas available), as `helm install --wait`.
        return await helm.Install(config).run(
            release,
            chart,
            values=json.loads(values),
            create_namespace=True,
            wait=True,
            timeout=TIMEOUT,
        )
    if action == "render":
        # What `helm template` prints, from a real install (helm-sdkpy has no template or dry-run
        # action): the release's manifest and hooks, without waiting for anything to run.
        release, chart, values = args
        return await helm.Install(config).run(
            release,
            chart,
            values=json.loads(values),
            create_namespace=True,
            wait=False,
            timeout=TIMEOUT,
        )
    if action == "upgrade":
        release, chart, values = args
        return await helm.Upgrade(config).run(
            release, chart, values=json.loads(values), wait=True, timeout=TIMEOUT
        )
    if action == "uninstall":
        (release,) = args
        return await helm.Uninstall(config).run(release, wait=True, timeout=TIMEOUT)
    raise ValueError(f"unknown action {action!r}: lint, install, render, upgrade or uninstall")


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    kubeconfig, namespace, action, *args = sys.argv[1:]
    try:
        result = asyncio.run(run(kubeconfig, namespace, action, args))
    except helm.HelmError as e:
        print(f"helm {action}: {e}", file=sys.stderr)
        sys.exit(1)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
