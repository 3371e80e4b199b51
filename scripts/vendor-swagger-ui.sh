#!/usr/bin/env bash
# Vendors Swagger UI (the renderer of the dashboard's API reference page,
# /ui/api/) from the npm registry into api/ui/vendor/swagger-ui: the
# browser bundle, its stylesheet and its licence files (the bundled
# libraries' notices among them), nothing else. The
# files are committed and embedded in meterd, so the page needs no CDN.
# Usage: scripts/vendor-swagger-ui.sh [version]
set -euo pipefail
version=${1:-5.35.0}
dest=$(cd "$(dirname "$0")/.." && pwd)/api/ui/vendor/swagger-ui
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "swagger-ui-dist@$version" >/dev/null && tar xzf swagger-ui-dist-"$version".tgz)
mkdir -p "$dest"
for f in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE; do
  cp "$tmp/package/$f" "$dest/$f"
done
{
  echo "swagger-ui-dist $version (https://www.npmjs.com/package/swagger-ui-dist), Apache-2.0"
  echo "vendored by scripts/vendor-swagger-ui.sh; sha256:"
  (cd "$dest" && sha256sum swagger-ui-bundle.js swagger-ui.css)
} > "$dest/VERSION"
echo "vendored swagger-ui-dist $version into $dest"
