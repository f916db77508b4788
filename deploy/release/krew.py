#!/usr/bin/env python3
"""Fills the release into the krew manifest, keeping its comments and layout:

    krew.py MANIFEST VERSION SHA256 [RELEASE_URL]

spec.version becomes vVERSION; the linux/amd64 platform's uri becomes
RELEASE_URL/vVERSION/snapdrain-linux-amd64.tar.gz (RELEASE_URL defaults to the current uri up to
/download) and its sha256 SHA256. Other platforms are left as they are.
"""

import re
import sys

ARCHIVE = "snapdrain-linux-amd64.tar.gz"


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    path, version, sha = sys.argv[1:4]
    base = sys.argv[4] if len(sys.argv) == 5 else ""
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        sys.exit(f"krew.py: {sha!r} is not a sha256 (64 lowercase hex digits)")
    lines = open(path).read().split("\n")
    done = {"version": 0, "uri": 0, "sha256": 0}
    in_amd64 = False
    for i, line in enumerate(lines):
        if re.match(r"^  version: ", line):
            lines[i] = f"  version: v{version}"
            done["version"] += 1
        elif re.match(r"^    - selector:", line):
            in_amd64 = False
        elif re.match(r"^          arch: amd64\s*$", line):
            in_amd64 = True
        elif in_amd64 and (m := re.match(r"^(      uri: )(\S+)$", line)):
            url = base.rstrip("/") if base else m.group(2).split("/download/")[0] + "/download"
            lines[i] = f"{m.group(1)}{url}/v{version}/{ARCHIVE}"
            done["uri"] += 1
        elif in_amd64 and (m := re.match(r"^(      sha256: )", line)):
            lines[i] = f'{m.group(1)}"{sha}"'
            done["sha256"] += 1
    if done != {"version": 1, "uri": 1, "sha256": 1}:
        sys.exit(f"krew.py: {path} is not laid out as expected (found {done}): spec.version and a "
                 "linux/amd64 platform with uri and sha256")
    open(path, "w").write("\n".join(lines))


if __name__ == "__main__":
    main()
