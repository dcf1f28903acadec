#!/usr/bin/env bash
# Renders the HTML report of the committed fixtures and opens it in headless Chromium: every plot
# must render (an <svg> with marks per plot, data-rendered == data-plots) and nothing may reach the
# console as an error. Skips (exit 77) when chromium or the vendored Vega bundles are absent.
set -uo pipefail
kvgate="$1"; out="$2"
src="${KVGATE_SOURCE_DIR:?}"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  echo "SKIP: chromium not installed (Debian package 'chromium'; scripts/setup.sh installs it)"; exit 77
fi
web="${KVGATE_WEB_DIR:-$src/reports/web}"
if [ ! -f "$web/node_modules/vega/build/vega.min.js" ]; then
  echo "SKIP: Vega bundles not vendored (run 'npm ci' in $web; scripts/setup.sh does)"; exit 77
fi
rm -rf "$out"; mkdir -p "$out"
fx="$src/reports/tests/fixtures"
"$kvgate" report --matrix "$fx/matrix.json" --gates "$fx/gates.json" --mutants "$fx/outcomes.json" \
  --web-dir "$web" --out "$out/report" > /dev/null || { echo "FAIL: kvgate report"; exit 1; }
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --user-data-dir="$profile" \
  --virtual-time-budget=20000 --enable-logging=stderr --v=0 \
  --dump-dom "file://$out/report/report.html" > "$out/dom.html" 2> "$out/chromium.log"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: chromium exited $rc"; tail -20 "$out/chromium.log"; exit 1; }
plots=$(grep -o 'data-plots="[0-9]*"' "$out/dom.html" | grep -o '[0-9]*')
rendered=$(grep -o 'data-rendered="[0-9]*"' "$out/dom.html" | grep -o '[0-9]*')
marks=$(grep -o 'class="marks"' "$out/dom.html" | wc -l)
errors=$(grep -o '<div id="kvgate-errors">[^<]*' "$out/dom.html" | sed 's/<div id="kvgate-errors">//')
console=$(grep -E 'CONSOLE|Uncaught' "$out/chromium.log" | grep -iE 'error|uncaught' || true)
echo "plots=$plots rendered=$rendered svg_marks=$marks"
fail=0
[ -n "$plots" ] && [ "$plots" -ge 5 ] || { echo "FAIL: expected >= 5 plots, page declares '${plots}'"; fail=1; }
[ "${rendered:-x}" = "${plots:-y}" ] || { echo "FAIL: $rendered of $plots plots rendered"; fail=1; }
[ "$marks" -ge "${plots:-1}" ] || { echo "FAIL: only $marks rendered <svg class=marks>"; fail=1; }
[ -z "$errors" ] || { echo "FAIL: page errors: $errors"; fail=1; }
[ -z "$console" ] || { echo "FAIL: console errors: $console"; fail=1; }
[ $fail -eq 0 ] && echo "html report renders in headless chromium with no console errors"
exit $fail
