#!/usr/bin/env bash
# Sets up a Debian 12 (or Ubuntu 24.04 / Debian 13) machine for kvgate and builds it.
#   scripts/setup.sh           install dependencies, configure, build (build/)
#   scripts/setup.sh --deps    install dependencies only (idempotent, quick when present)
#   scripts/setup.sh --run     ... and then run the main job on the default model (stories260K)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-build}"

apt_packages=(
  build-essential cmake ninja-build ccache git pkg-config python3 curl ca-certificates
  libeigen3-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev libxxhash-dev
  catch2 chromium libxml2-utils shellcheck
)
# Node.js + npm from Debian unless a Node.js with npm is already installed (another source's
# nodejs package bundles npm and conflicts with Debian's npm package).
command -v npm >/dev/null 2>&1 || apt_packages+=(nodejs npm)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "kvgate setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Web components for the HTML pages (Vega-Lite for reports, mutation-testing-elements for the
# mutation report), installed from the npm registry into each folder's ignored node_modules and
# inlined into the pages, so the pages work offline.
for web in "$here/mutations/web" "$here/reports/web"; do
  if [ -f "$web/package.json" ] && [ ! -d "$web/node_modules" ]; then
    echo "kvgate setup: npm packages for ${web#$here/}"
    if [ -f "$web/package-lock.json" ]; then
      npm ci --prefix "$web" --no-audit --no-fund --loglevel=error
    else
      npm install --prefix "$web" --no-audit --no-fund --loglevel=error
    fi
  fi
done

# The default model: ../shared/models/stories260K (or $KVGATE_MODELS). A clone of a local checkout
# made elsewhere (git clone /path/to/kvgate /tmp/x) has no ../shared beside it: the files are copied
# into .models from the ../shared/models beside the checkout it was cloned from. Otherwise they are
# fetched from their public source. Either way the llama2.c files are checked against their SHA-256.
models="${KVGATE_MODELS:-$here/../shared/models}"
if [ ! -f "$models/stories260K/stories260K.bin" ]; then
  models="$here/.models"
  mkdir -p "$models/stories260K"
  origin="$(git -C "$here" remote get-url origin 2>/dev/null || true)"
  if [ -n "$origin" ] && [ -f "$origin/../shared/models/stories260K/stories260K.bin" ]; then
    for src in "$origin"/../shared/models/stories260K/*; do
      f="$(basename "$src")"
      [ -f "$models/stories260K/$f" ] ||
        { cp "$src" "$models/stories260K/$f.part" && mv "$models/stories260K/$f.part" "$models/stories260K/$f"; }
    done
    echo "kvgate setup: stories260K copied to $models from the checkout this clone came from ($origin)"
  fi
  base="https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K"
  fetched=1
  for f in stories260K.bin tok512.bin; do
    if [ ! -f "$models/stories260K/$f" ]; then
      curl -fsSL -o "$models/stories260K/$f.part" "$base/$f" && mv "$models/stories260K/$f.part" "$models/stories260K/$f" || fetched=0
    fi
  done
  if [ "$fetched" = 1 ] && (cd "$models/stories260K" && sha256sum -c --quiet - <<SUMS
b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  stories260K.bin
037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312  tok512.bin
SUMS
  ); then
    echo "kvgate setup: stories260K in $models (export KVGATE_MODELS=$models)"
  else
    rm -f "$models"/stories260K/*.part
    echo "kvgate setup: WARNING: stories260K is not in ../shared/models or \$KVGATE_MODELS and could not be" \
         "downloaded; the model gates will fail naming where they looked. Put the files there or set KVGATE_MODELS." >&2
  fi
fi

[ "$mode" = "--deps" ] && exit 0

cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$here/build" -j"$(nproc)"

if [ "$mode" = "--run" ]; then
  export KVGATE_MODELS="$models"
  # The main job: gates + mutation proof + matrix + quality vs the baseline under the release policy
  # -> conformance and fit per format and the report; its exit code (README) is the script's.
  "$here/build/kvgate" signoff --all --out "$here/kvgate.out/signoff"
fi
