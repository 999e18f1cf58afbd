#!/usr/bin/env bash
# Fails when a committed file is a binary or larger than 1 MiB: build outputs
# belong in .gitignore, not in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  if [ "$size" -gt 1048576 ]; then
    echo "error: $f is $size bytes (over 1 MiB): do not commit it" >&2; bad=1
  fi
  if [ "$size" -gt 0 ] && ! grep -qI . "$f"; then
    echo "error: $f is a binary file: do not commit build outputs (add them to .gitignore)" >&2; bad=1
  fi
done < <(git ls-files -z)
exit $bad
