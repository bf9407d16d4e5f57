#!/usr/bin/env bash
# Regenerates DejaVuSans-subset.ttf: DejaVu Sans (Debian 12's fonts-dejavu-core 2.37-6) cut to
# printable ASCII and the few symbols the charts may print, with fontTools' pyftsubset
# (`pip install fonttools`). The subset keeps the glyphs' outlines and metrics unchanged.
set -euo pipefail
src="${1:-/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf}"
out="$(dirname "$0")/DejaVuSans-subset.ttf"
pyftsubset "$src" \
    --unicodes="U+0020-007E,U+00B0,U+00D7,U+2212,U+2013,U+2014,U+2026" \
    --layout-features='' --no-hinting --output-file="$out"
sha256sum "$out"
