"""Fonts for matplotlib: the CJK and emoji fallback chain, and no boxes where a glyph is missing.

matplotlib draws text with the fonts of ``rcParams["font.family"]`` (a list is a per-glyph fallback
chain). :func:`fallback_fonts` lists the CJK and emoji families installed here, in order of
preference; ``nb.setup`` appends them to the chain. A machine without them (a fresh macOS or
Windows, a minimal Linux) would get an empty box ("tofu") for every Chinese character or emoji and
a "Glyph ... missing" warning for each: :func:`guard_missing_glyphs` instead draws such a character
as its Python escape (``\\u82f9``) and says once, in one line, which font to install
(``python -m llmlab doctor`` checks the same). :func:`set_min_size` puts a floor under every font
size, so that no figure asks for text a projector cannot show.
"""
from __future__ import annotations

import sys
import unicodedata
import warnings
from pathlib import Path

# CJK families, most preferred first: Noto (Linux, conda-forge, Homebrew), then what macOS and
# Windows ship (Hiragino Sans GB, STHeiti and Arial Unicode MS on macOS; Microsoft YaHei, SimHei on Windows)
CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Zen Hei",
                "Droid Sans Fallback", "Hiragino Sans GB", "STHeiti", "Arial Unicode MS", "Microsoft YaHei", "SimHei")
# emoji as outlines, which matplotlib can draw (colour bitmap fonts such as Noto Color Emoji it cannot)
EMOJI_FAMILIES = ("Noto Emoji", "Segoe UI Emoji", "Symbola")
# fonts that come with llmlab (font_files/, each with its licence): glyphs the lessons show that few
# machines have a font for, reduced to those glyphs (notebook 02's Egyptian hieroglyph)
SHIPPED_DIR = Path(__file__).with_name("font_files")
SHIPPED_FAMILIES = ("Noto Sans EgyptHiero",)
FALLBACK_FONTS = CJK_FAMILIES + EMOJI_FAMILIES + SHIPPED_FAMILIES
# colour emoji a browser (JupyterLab's HTML and widgets) shows: file names as installed
COLOR_EMOJI_FILES = ("NotoColorEmoji", "Apple Color Emoji", "seguiemj")


def matplotlib_families(refresh: bool = True) -> set[str]:
    """The font families matplotlib can use. With ``refresh``, fonts installed after matplotlib
    built its font cache (a CJK font just installed) make it rebuild the cache once."""
    from matplotlib import font_manager
    installed = {f.name for f in font_manager.fontManager.ttflist}
    if not installed.issuperset(SHIPPED_FAMILIES):
        for path in sorted(SHIPPED_DIR.glob("*.ttf")):
            font_manager.fontManager.addfont(str(path))
        installed = {f.name for f in font_manager.fontManager.ttflist}
    if refresh and not installed & set(CJK_FAMILIES) and any("CJK" in Path(f).name for f in _system_fonts()):
        font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
        return matplotlib_families(refresh=False)
    return installed


def _system_fonts() -> list[str]:
    from matplotlib import font_manager
    try:
        return font_manager.findSystemFonts()
    except Exception:       # a broken fontconfig: matplotlib's own list still works
        return []


def fallback_fonts(installed: set[str] | None = None) -> list[str]:
    """The CJK and emoji families installed here that matplotlib can draw, in order of preference."""
    installed = matplotlib_families() if installed is None else installed
    return [name for name in FALLBACK_FONTS if name in installed]


def report() -> dict:
    """What ``doctor`` says about fonts: the CJK and emoji families matplotlib has, and the colour
    emoji fonts a browser can use."""
    installed = matplotlib_families()
    colour = sorted({Path(f).name for f in _system_fonts() if any(k in Path(f).name for k in COLOR_EMOJI_FILES)})
    return {"cjk": [f for f in CJK_FAMILIES if f in installed],
            "emoji_figures": [f for f in EMOJI_FAMILIES if f in installed],
            "emoji_browser": colour}


# ---------------------------------------------------------------- no boxes for missing glyphs

_COVERAGE: dict[tuple, frozenset] = {}
_NOTED: list[str] = []
_GUARD: list = []
_EXTRA: list[str] = []       # the fallback families (nb.setup's), tried for text whose own fonts lack a glyph


def _font_paths(prop) -> tuple:
    from matplotlib import font_manager
    try:        # the fallback chain the Agg and SVG backends use
        return tuple(str(p) for p in font_manager.fontManager._find_fonts_by_props(prop))
    except Exception:
        return (str(font_manager.findfont(prop)),)


def _coverage(prop) -> frozenset:
    from matplotlib import font_manager
    paths = _font_paths(prop)
    if paths not in _COVERAGE:
        chars: set[int] = set()
        for p in paths:
            try:
                chars.update(font_manager.get_font(p).get_charmap())
            except Exception:
                pass
        _COVERAGE[paths] = frozenset(chars)
    return _COVERAGE[paths]


def drawable(text: str, prop=None) -> tuple[str, str]:
    """``text`` with each character the fonts of ``prop`` lack written as its escape (``\\u82f9``),
    and the characters replaced. Invisible joiners and variation selectors that no font has are dropped."""
    if text.isascii():
        return text, ""
    from matplotlib.font_manager import FontProperties
    cov = _coverage(prop if prop is not None else FontProperties())
    out, missing = [], []
    for ch in text:
        o = ord(ch)
        if o < 0x80 or o in cov:
            out.append(ch)
        elif unicodedata.category(ch) in ("Mn", "Me", "Cf"):   # U+FE0F, U+200D: nothing to see
            continue
        else:
            out.append(f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
            missing.append(ch)
    return "".join(out), "".join(missing)


def note_missing(chars: str, stream=None) -> None:
    """Say once per process, in one line, that some characters have no font here."""
    if _NOTED or not chars:
        return
    _NOTED.append(chars)
    from ..hints import hint
    kinds = []
    if any(unicodedata.name(c, "").startswith("CJK") for c in chars):
        kinds.append(f"CJK: {hint('fonts-cjk')}")
    if any(ord(c) >= 0x1F000 for c in chars):
        kinds.append(f"emoji: {hint('fonts-emoji-figures')}")
    line = (f"fonts: no installed font has {chars[:8]!r}, so figures write such characters as \\u escapes "
            f"({'; '.join(kinds) or 'install a font that has them'}; `python -m llmlab doctor` checks the fonts)")
    stream = stream or sys.stdout
    try:
        print(line, file=stream)
    except UnicodeEncodeError:         # a console that cannot show the characters themselves (Windows cp1252)
        print(line.encode("ascii", "backslashreplace").decode("ascii"), file=stream)


def guard_missing_glyphs(fallbacks=()) -> None:
    """From now on, matplotlib text that has a character its own fonts lack is drawn with the
    ``fallbacks`` families appended to its fonts (a monospace label with Chinese in it), and a
    character no font here has is drawn as its escape instead of a box, said once in one line
    (no "Glyph ... missing" warning per character)."""
    _EXTRA[:] = list(fallbacks)
    if _GUARD:
        return
    from matplotlib import cbook
    from matplotlib.text import Text
    original = Text.draw

    def draw(self, renderer):
        s = self._text
        if not isinstance(s, str) or s.isascii() or self.get_usetex() or cbook.is_math_text(s):
            return original(self, renderer)
        prop = self.get_fontproperties()
        shown, missing = drawable(s, prop)
        if not missing and shown == s:
            return original(self, renderer)
        wider = None
        if missing and _EXTRA:                   # the fallback fonts may have what this text's fonts lack
            wider = prop.copy()
            wider.set_family(list(prop.get_family()) + [f for f in _EXTRA if f not in prop.get_family()])
            shown, missing = drawable(s, wider)
        note_missing(missing)
        self._text = shown
        if wider is not None:
            self._fontproperties = wider
        try:
            return original(self, renderer)
        finally:
            self._text = s
            self._fontproperties = prop

    draw.__wrapped__ = original
    Text.draw = draw
    _GUARD.append(original)
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)


# ---------------------------------------------------------------- a floor under font sizes

_MIN_SIZE: list[float] = []


def set_min_size(points: float) -> None:
    """From now on no matplotlib text is smaller than ``points`` (``fontsize=6`` becomes ``points``;
    0 removes the floor). The floor acts where every size is set, ``FontProperties.set_size``, so
    layout (``tight_layout``, ``bbox_inches="tight"``) measures the size that is drawn."""
    from matplotlib.font_manager import FontProperties
    if not _MIN_SIZE:
        original = FontProperties.set_size

        def set_size(self, size):
            original(self, size)
            if self._size < _MIN_SIZE[0]:
                self._size = _MIN_SIZE[0]

        set_size.__wrapped__ = original
        FontProperties.set_size = set_size
        _MIN_SIZE.append(0.0)
    _MIN_SIZE[0] = float(points)


def min_size() -> float:
    """The floor :func:`set_min_size` set (0: none)."""
    return _MIN_SIZE[0] if _MIN_SIZE else 0.0


# ---------------------------------------------------------------- a glyph drawn from its outline

def font_with(ch: str) -> str | None:
    """The file of a font here that has ``ch``: matplotlib's default, the fallback chain, then
    llmlab's shipped fonts; None when none has it."""
    from matplotlib import font_manager
    from matplotlib.font_manager import FontProperties
    installed = matplotlib_families(refresh=False)
    families = [FontProperties().get_family()[0]] + [f for f in FALLBACK_FONTS if f in installed]
    for path in _font_paths(FontProperties(family=families)):
        try:
            if ord(ch) in font_manager.get_font(path).get_charmap():
                return path
        except Exception:
            continue
    return None


def glyph_svg(ch: str, px: int = 40) -> str | None:
    """``ch`` as an inline SVG of its outline, ``px`` pixels high, from a font here that has it: it
    shows in any browser, even one without such a font (an Egyptian hieroglyph, a rare script).
    None when no font here has it."""
    from matplotlib.font_manager import FontProperties, get_font
    from matplotlib.path import Path as MPath
    from matplotlib.textpath import TextPath
    path = font_with(ch)
    if path is None:
        return None
    tp = TextPath((0, 0), ch, size=px * 0.75, prop=FontProperties(fname=path))
    d = []
    for verts, code in tp.iter_segments(simplify=False, curves=True):
        xy = " ".join(f"{x:.1f},{px * 0.8 - y:.1f}" for x, y in zip(verts[::2], verts[1::2]))
        d.append({MPath.MOVETO: "M", MPath.LINETO: "L", MPath.CURVE3: "Q", MPath.CURVE4: "C"}.get(code, "Z") +
                 ("" if code == MPath.CLOSEPOLY else xy))
    width = max(tp.get_extents().x1 + px * 0.1, px * 0.5)
    name = get_font(path).family_name
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{px}' viewBox='0 0 {width:.0f} {px}' "
            f"role='img' aria-label='{ch}'><title>{name}</title><path d='{''.join(d)}'/></svg>")
