#!/usr/bin/env python3
"""The shell commands of one of the README's fenced `sh` blocks, one per line, so the
end-to-end runs exactly what the README tells a person to run.

    readme.py README.md HEADING [FIRST LAST]

HEADING is the text of the Markdown heading the block follows (its first `sh` block).
Backslash continuations are joined and comments dropped. With FIRST and LAST, only the
commands under the block's numbered comments `# FIRST.` to `# LAST.` are printed.
Exits 2, naming what is missing, when the heading, the block or a numbered part is not
there — a README edit that breaks the end-to-end's path fails it loudly.
"""
import re
import sys


def block_after(text, heading):
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#") and line.lstrip("#").strip() == heading:
            rest = lines[i + 1 :]
            break
    else:
        sys.exit(f"readme.py: no heading {heading!r}")
    for j, line in enumerate(rest):
        if line.strip() == "```sh":
            body = []
            for line in rest[j + 1 :]:
                if line.strip() == "```":
                    return body
                body.append(line)
            sys.exit(f"readme.py: the block after {heading!r} is not closed")
        if line.startswith("#") and not line.startswith("#!"):
            break
    sys.exit(f"readme.py: no sh block after {heading!r}")


def strip_comment(line):
    """The line without a trailing `# comment` outside quotes."""
    quote = None
    for k, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip()
    return line.rstrip()


def commands(body):
    """(part, command): part is the number of the last `# N.` comment seen, or 0."""
    part, pending, out = 0, "", []
    for raw in body:
        numbered = re.match(r"\s*#\s*(\d+)\.", raw)
        if numbered and not pending:
            part = int(numbered.group(1))
            continue
        line = strip_comment(raw)
        if not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        out.append((part, (pending + line.strip()).strip()))
        pending = ""
    return out


def main():
    if len(sys.argv) not in (3, 5):
        sys.exit(__doc__)
    text = open(sys.argv[1], encoding="utf-8").read()
    found = commands(block_after(text, sys.argv[2]))
    if len(sys.argv) == 5:
        first, last = int(sys.argv[3]), int(sys.argv[4])
        parts = {p for p, _ in found}
        missing = [n for n in range(first, last + 1) if n not in parts]
        if missing:
            sys.exit(f"readme.py: no part {missing} in the block after {sys.argv[2]!r}")
        found = [(p, c) for p, c in found if first <= p <= last]
    for _, command in found:
        print(command)


if __name__ == "__main__":
    main()
