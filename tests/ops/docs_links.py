#!/usr/bin/env python3
"""The front door's and the guides' relative links lead somewhere.

  docs_links.py SOURCE_ROOT

Every Markdown link in README.md and docs/*.md that is not a URL (scheme:...) must name a file
or folder that exists in the source tree, relative to the document; a link with an anchor into a
Markdown file (FILE.md#anchor, or #anchor within the document) must name one of that file's
headings, slugged as GitHub does (lower case, punctuation dropped, blanks as hyphens). Links in
fenced code blocks and inline code are not links.
"""
import glob
import os
import re
import sys

root = sys.argv[1]
docs = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text):
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"(`+).*?\1", "", text, flags=re.S)


def slugs(path):
    found = set()
    counts = {}
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        s = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = counts.get(s, 0)
        counts[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found


fail = []
checked = 0
for doc in docs:
    if not os.path.exists(doc):
        fail.append(f"{os.path.relpath(doc, root)}: missing")
        continue
    for target in LINK.findall(prose(open(doc, encoding="utf-8").read())):
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target):
            continue  # a URL (https:, mailto:, ...)
        checked += 1
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        name = f"{os.path.relpath(doc, root)}: ({target})"
        if not os.path.realpath(where).startswith(os.path.realpath(root) + os.sep):
            fail.append(f"{name} leaves the source tree")
        elif not os.path.exists(where):
            fail.append(f"{name} names {os.path.relpath(where, root)}, which does not exist")
        elif anchor and where.endswith(".md") and anchor not in slugs(where):
            fail.append(f"{name}: {os.path.relpath(where, root)} has no heading #{anchor}")

for f in fail:
    print(f"FAIL {f}")
print(f"{checked} relative links in {len(docs)} documents, {len(fail)} broken")
sys.exit(1 if fail else 0)
