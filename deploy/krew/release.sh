#!/usr/bin/env bash
# Renders the krew manifest of a release: deploy/krew/norsk.yaml with its version, its
# download base and the sha256 of each platform's archive filled in.
#
#   deploy/krew/release.sh VERSION BASE_URL ARCHIVE_DIR > norsk-VERSION.yaml
#
# VERSION      the release tag, e.g. v0.2.0
# BASE_URL     where the archives are served; each platform's uri becomes
#              BASE_URL/VERSION/kubectl-norsk-VERSION-<target>.tar.gz
# ARCHIVE_DIR  holds those archives (kubectl-norsk and LICENSE at the root of each, built
#              with `cargo build --release --bin kubectl-norsk --target <target>`)
#
# Every platform of the manifest needs its archive: a missing one fails the render, so a
# manifest never points at a file that was not published.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 VERSION BASE_URL ARCHIVE_DIR" >&2
    exit 2
fi
version="$1"
base="${2%/}"
dir="$3"
if [[ ! "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]]; then
    echo "$0: VERSION must be a semantic version tag like v0.2.0, not '$version'" >&2
    exit 2
fi
template="$(dirname "$0")/norsk.yaml"
# The template's own version and download base, replaced wherever they appear.
template_version="$(sed -n 's/^  version: //p' "$template")"
template_base="https://RELEASE_URL"

echo "# krew plugin manifest of kubectl-norsk $version: kubectl krew install --manifest=<this file>"
pending=""
while IFS= read -r line; do
    # The template's own header speaks of the template.
    [[ "$line" == \#* ]] && continue
    line="${line//$template_base/$base}"
    line="${line//$template_version/$version}"
    if [[ "$line" =~ ^([[:space:]]*)uri:[[:space:]]*(.*)$ ]]; then
        archive="$dir/${BASH_REMATCH[2]##*/}"
        if [[ ! -f "$archive" ]]; then
            echo "$0: the archive $archive for ${BASH_REMATCH[2]} is missing" >&2
            exit 1
        fi
        pending="$(sha256sum "$archive" | cut -d' ' -f1)"
    elif [[ "$line" =~ ^([[:space:]]*)sha256: ]]; then
        if [[ -z "$pending" ]]; then
            echo "$0: a sha256 without its uri in $template" >&2
            exit 1
        fi
        line="${BASH_REMATCH[1]}sha256: \"$pending\""
        pending=""
    fi
    printf '%s\n' "$line"
done < "$template"
