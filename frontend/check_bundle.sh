#!/usr/bin/env bash
# Rebuilds the dashboard and fails when the committed tb_gpuprof/static/index.js differs.
# Run after `npm ci` in frontend/.
set -euo pipefail
cd "$(dirname "$0")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
node build.mjs --outfile "$tmp/index.js" >/dev/null
if ! cmp -s "$tmp/index.js" ../tb_gpuprof/static/index.js; then
  echo "tb_gpuprof/static/index.js is stale: run 'cd frontend && npm ci && npm run build' and commit it" >&2
  exit 1
fi
echo "bundle up to date ($(wc -c < ../tb_gpuprof/static/index.js) bytes)"
