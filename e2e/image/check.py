#!/usr/bin/env python3
"""Holds an assembled OCI image against the Dockerfile's final stage.

    check.py DOCKERFILE OCI_LAYOUT TAG [ARG=VALUE ...]

The Dockerfile is the public recipe; e2e/image/build.sh assembles the same image without a
Docker daemon. This fails (exit 1, every difference listed) when the two disagree on what a
user of the image meets: USER, EXPOSE, ENTRYPOINT, CMD, LABELs (with the final stage's ARGs
given the values of the build), the path of each file COPY'd from the build stage, and what
the distroless nonroot base provides (the user, the CA certificates).
"""

import gzip
import json
import os
import re
import shlex
import sys
import tarfile


def instructions(dockerfile):
    """(keyword, rest) of each instruction, continuation lines joined, comments dropped."""
    out, pending = [], ""
    with open(dockerfile, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line = pending + line
            pending = ""
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def final_stage(dockerfile):
    steps = instructions(dockerfile)
    last = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    return steps[last][1], steps[last + 1 :]


def substitute(text, args):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def exec_form(rest):
    rest = rest.strip()
    if rest.startswith("["):
        return json.loads(rest)
    return ["/bin/sh", "-c", rest]


def expected(dockerfile, build_args):
    base, steps = final_stage(dockerfile)
    want = {"base": base, "labels": {}, "exposed": set(), "copies": [], "user": None,
            "entrypoint": None, "cmd": None}
    args = {}
    for keyword, rest in steps:
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = build_args.get(name, default.strip('"'))
        elif keyword == "LABEL":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                want["labels"][key] = substitute(value, args)
        elif keyword == "EXPOSE":
            for port in rest.split():
                want["exposed"].add(port if "/" in port else port + "/tcp")
        elif keyword == "USER":
            want["user"] = substitute(rest, args)
        elif keyword == "ENTRYPOINT":
            want["entrypoint"] = exec_form(rest)
        elif keyword == "CMD":
            want["cmd"] = exec_form(rest)
        elif keyword == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            want["copies"].append(parts[-1])
        elif keyword in ("WORKDIR", "ENV", "RUN", "ADD", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "SHELL"):
            # Not assembled by e2e/image/build.sh: a new instruction here needs it there too.
            want.setdefault("unsupported", []).append(keyword)
    return want


def blob(layout, digest):
    algorithm, _, hex_digest = digest.partition(":")
    return os.path.join(layout, "blobs", algorithm, hex_digest)


def image(layout, tag):
    with open(os.path.join(layout, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    for manifest in index["manifests"]:
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            with open(blob(layout, manifest["digest"]), encoding="utf-8") as f:
                body = json.load(f)
            with open(blob(layout, body["config"]["digest"]), encoding="utf-8") as f:
                config = json.load(f)
            files = {}
            for layer in body["layers"]:
                opener = gzip.open if layer["mediaType"].endswith("gzip") else open
                with opener(blob(layout, layer["digest"]), "rb") as raw, tarfile.open(fileobj=raw) as tar:
                    for member in tar:
                        files["/" + member.name.lstrip("./")] = member
                        if member.name.endswith("/etc/passwd") or member.name.lstrip("./") == "etc/passwd":
                            files["passwd-content"] = tar.extractfile(member).read().decode()
            return config, files
    raise SystemExit(f"check.py: no image tagged {tag!r} in {layout}")


def main():
    dockerfile, layout, tag = sys.argv[1:4]
    build_args = dict(a.split("=", 1) for a in sys.argv[4:])
    want = expected(dockerfile, build_args)
    config, files = image(layout, tag)
    got = config.get("config", {})
    problems = []

    def compare(what, expected_value, actual):
        if expected_value != actual:
            problems.append(f"{what}: Dockerfile says {expected_value!r}, image has {actual!r}")

    compare("USER", want["user"], got.get("User"))
    compare("ENTRYPOINT", want["entrypoint"], got.get("Entrypoint"))
    compare("CMD", want["cmd"], got.get("Cmd"))
    compare("EXPOSE", sorted(want["exposed"]), sorted(got.get("ExposedPorts", {})))
    compare("LABEL", want["labels"], got.get("Labels", {}))
    for key in ("org.opencontainers.image.version", "org.opencontainers.image.revision",
                "org.opencontainers.image.source", "org.opencontainers.image.licenses"):
        if not want["labels"].get(key):
            problems.append(f"LABEL {key}: missing from the Dockerfile's final stage")
    for path in want["copies"]:
        member = files.get(path)
        if member is None or not member.isfile():
            problems.append(f"COPY {path}: no such file in the image")
        elif not member.mode & 0o111:
            problems.append(f"COPY {path}: not executable in the image")
    for keyword in want.get("unsupported", []):
        problems.append(f"{keyword}: in the Dockerfile's final stage but not assembled by e2e/image/build.sh")
    if "distroless" in want["base"] and ":nonroot" in want["base"]:
        uid = (want["user"] or "").split(":")[0]
        if not re.search(rf"^nonroot:x:{uid}:", files.get("passwd-content", ""), re.M):
            problems.append(f"base {want['base']}: no nonroot user {uid} in /etc/passwd")
        if "/etc/ssl/certs/ca-certificates.crt" not in files:
            problems.append(f"base {want['base']}: no CA certificates")
    if config.get("os") != "linux":
        problems.append(f"os: {config.get('os')!r}, expected linux")

    if problems:
        print("the assembled image disagrees with the Dockerfile's final stage:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"image {tag} matches the Dockerfile's final stage ({want['base']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
