#!/usr/bin/env bash
# Builds the book in docs/ with mdBook into the Switchyard cache
# ($SWITCHYARD_CACHE or ~/.cache/switchyard)/book: the HTML, and the link
# checker's pass over every chapter, which fails the build on a link to a
# missing file or heading. Installs mdBook first (scripts/install-mdbook.sh,
# cached). `scripts/book.sh serve` serves it on localhost:3000 instead.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
scripts/install-mdbook.sh >/dev/null
export PATH="$CACHE/mdbook/v${MDBOOK_VERSION:-0.4.52}/bin:$PATH"
if [ "${1:-}" = serve ]; then
  exec mdbook serve docs -d "$CACHE/book"
fi
mdbook build docs -d "$CACHE/book"
echo "book: $CACHE/book/html/index.html"
