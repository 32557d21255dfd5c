#!/usr/bin/env bash
# The data recipe of the GPT's real-text run (experiments/passes/gpt_realtext_pass.sh): .data/python-docs.txt, 11 MB of
# English, the reStructuredText sources of the Python 3.11 documentation as Debian ships them in python3.11-doc
# (html/_sources/**/*.txt, 497 files), concatenated in sorted path order. Needs a Debian/Ubuntu machine with apt
# and a mirror (no root needed for `apt-get download`); the device machines have no network, so make it here and
# carry .data/ to them. .data/ is ignored by git (the text is the PSF's, not this repository's).
#
#     bash experiments/bench/real_text.sh            # -> .data/python-docs.txt, its sha256 checked
#
# Debian bookworm's python3.11-doc 3.11.2-6+deb12u8 gives sha256 deb6b62f...1530b (11,046,319 bytes); another
# package version gives another text, which the script says, keeping the file.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.data/python-docs.txt
WANT=deb6b62f263c58c756f3d3948e89713228497fbdecc2f1f49335ccb03a21530b
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download python3.11-doc > /dev/null)
deb=$(ls "$work"/python3.11-doc_*.deb)
echo "real_text: $(basename "$deb")"
dpkg-deb -x "$deb" "$work/x"
sources="$work/x/usr/share/doc/python3.11/html/_sources"
mkdir -p .data
# Sorted in the C locale so every machine concatenates the files in the same order.
(cd "$sources" && find . -name '*.txt' -print0 | LC_ALL=C sort -z | xargs -0 cat) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
got=$(sha256sum "$OUT" | cut -d' ' -f1)
echo "real_text: wrote $OUT ($(wc -c < "$OUT") bytes, $(cd "$sources" && find . -name '*.txt' | wc -l) files)"
if [ "$got" = "$WANT" ]; then
  echo "real_text: sha256 $got, the text of the committed results"
else
  echo "real_text: sha256 $got differs from the committed results' $WANT (another package version)"
fi
