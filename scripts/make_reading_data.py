"""Write ``src/capreward/reading_unicode.txt``: the Unicode data the caption reading uses, taken from ICU.

The reading (:mod:`capreward.caption_reading`) needs three Unicode properties that Python's ``unicodedata``
does not give: the TR39 confusable skeleton of each code point (``confusables.txt``), each code point's
Script, and the TR39 Identifier_Status "Allowed" set (Recommended and Inclusion: the letters of modern
orthographies). ICU ships all three, maintained with each Unicode release, and PyICU reads
them; this script dumps them in a small text file so that the package needs neither ICU nor PyICU at run
time. Run it again when a new ICU (Unicode version) is out::

    python -m venv /tmp/icu && /tmp/icu/bin/pip install pyicu-wheels   # or PyICU against a system ICU
    /tmp/icu/bin/python scripts/make_reading_data.py                     # rewrites the data file

The file is Unicode data (© Unicode, Inc., Unicode License v3, https://www.unicode.org/license.txt),
reformatted; its header says which ICU and Unicode versions it was taken from.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "capreward" / "reading_unicode.txt"
LAST = 0x10FFFF


def ranges(flags):
    """[(start, end, value)] of consecutive code points with the same non-None value."""
    out = []
    for cp in range(LAST + 1):
        v = flags(cp)
        if out and v is not None and out[-1][2] == v and out[-1][1] == cp - 1:
            out[-1][1] = cp
        elif v is not None:
            out.append([cp, cp, v])
    return out


def main(argv=None) -> int:
    import icu  # PyICU (pip install pyicu-wheels, or PyICU against a system ICU)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    checker = icu.SpoofChecker()
    recommended = icu.SpoofChecker.getRecommendedUnicodeSet()
    inclusion = icu.SpoofChecker.getInclusionUnicodeSet()

    def char(cp):
        return None if 0xD800 <= cp <= 0xDFFF else chr(cp)

    lines = [
        "# The Unicode data of capreward's caption reading (capreward/caption_reading.py), written by",
        "# scripts/make_reading_data.py from ICU; do not edit by hand, run the script again.",
        f"# ICU {icu.ICU_VERSION}, Unicode {icu.UNICODE_VERSION}. Unicode data: (c) Unicode, Inc., distributed under",
        "# the Unicode License v3 (https://www.unicode.org/license.txt); reformatted, not changed.",
        "# Sections: @confusables code point -> its UTS #39 skeleton (confusables.txt, only where the skeleton",
        "# is not the code point's NFD; Hangul left out); @scripts ranges -> Script (short name; Common, Inherited and Unknown",
        "# left out); @recommended ranges of Identifier_Status=Allowed (UTS #39 Recommended and Inclusion).",
        f"@version icu={icu.ICU_VERSION} unicode={icu.UNICODE_VERSION}",
        "@confusables",
    ]
    for cp in range(LAST + 1):
        ch = char(cp)
        if ch is None:
            continue
        if icu.Script.getScript(cp).getShortName() == "Hang":
            continue  # jamo sequences within Hangul: never a look-alike of another script's letter
        skeleton = checker.getSkeleton(0, ch)
        if skeleton != unicodedata.normalize("NFD", ch) and skeleton != ch:
            lines.append(f"{cp:04X} {' '.join(f'{ord(c):04X}' for c in skeleton)}")

    def script(cp):
        if char(cp) is None:
            return None
        name = icu.Script.getScript(cp).getShortName()
        return None if name in ("Zyyy", "Zinh", "Zzzz") else name

    lines.append("@scripts")
    lines += [f"{a:04X} {b:04X} {v}" for a, b, v in ranges(script)]
    lines.append("@recommended")
    lines += [f"{a:04X} {b:04X}" for a, b, _ in ranges(
        lambda cp: True if char(cp) is not None and (recommended.contains(chr(cp)) or inclusion.contains(chr(cp))) else None)]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(lines)} lines) from ICU {icu.ICU_VERSION} / Unicode {icu.UNICODE_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
