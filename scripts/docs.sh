#!/usr/bin/env bash
# Builds the documentation site into build/site (mkdocs, strict: a broken link or a page
# outside the navigation's files fails it) after regenerating the command reference
# from the built program. Usage: scripts/docs.sh [serve]  (serve: http://127.0.0.1:8000)
set -euo pipefail
cd "$(dirname "$0")/.."
/usr/bin/python3 scripts/cli_reference.py --rlsched "${RLSCHED_BIN:-build/rlsched}"
if [ "${1:-}" = serve ]; then
  exec mkdocs serve
fi
mkdocs build --strict --site-dir build/site
echo "docs: build/site/index.html" >&2
