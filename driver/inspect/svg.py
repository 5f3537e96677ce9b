"""``kubectl patchbay topology NODE --svg FILE``: the same tree as a picture.

Why a hand-written SVG: the tree is a few nested boxes, and a pure-Python
writer needs no graphviz binary or new dependency. The picture draws the
view of :func:`driver.inspect.topology.topology_view`: a frame per NUMA
node, in it a box per ``pcieRoot`` in that root's own colour, in the box
its GPUs (allocated MIG slices indented under their GPU) and NICs with
their VFs, one row per device with its state and the claim and pod holding
it. GPUs and VFs in one box share a root, so they can satisfy a
``matchAttribute: pcieRoot`` constraint together; a root with a free GPU
and a free VF right now gets a thick green border and the ``pairable``
badge. Device rows are filled by state: free white, used in the root's
colour, blocked grey.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape, quoteattr

ROW, PAD, MIN_W, GAP = 22, 10, 380, 16
CHAR_W = 7.3  # the advance of a 12 px monospace glyph
LEGEND_X, LEGEND_W = 276, 440
FONT = "font-family='DejaVu Sans Mono,monospace'"
# Light fills per root; the used rows take the same hue, darker.
PALETTE = (
    ("#e3f0fb", "#7fb3e0"),
    ("#fdf0dc", "#f0b866"),
    ("#e6f5e6", "#86c98a"),
    ("#f6e6f6", "#cc8fcc"),
    ("#eeeeee", "#aaaaaa"),
    ("#fbe7e6", "#e59690"),
)
BLOCKED, PAIRABLE = "#d0d0d0", "#1b9e3e"


def _rows(root: Mapping[str, Any]) -> list[tuple[int, str, Mapping[str, Any] | None]]:
    """``(indent, label, device or None)`` per line of a root's box."""
    rows: list[tuple[int, str, Mapping[str, Any] | None]] = []
    for g in root["gpus"]:
        rows.append((0, "gpu", g))
        rows.extend((1, f"mig {m.get('profile') or ''}", m) for m in g["mig"])
    for n in root["nics"]:
        bdf = f" ({n['pfPciBusID']})" if n.get("pfPciBusID") else ""
        rows.append((0, f"nic {n['pf']}{bdf}", None))
        rows.extend((1, "vf", v) for v in n["vfs"])
    return rows


def _device_text(label: str, d: Mapping[str, Any]) -> str:
    text = f"{label} {d['device']} {d['state']}"
    if d.get("attachment"):
        text += " (fabric)"
    if "claim" in d:
        text += f" {d['claim']}"
        if d.get("pods"):
            text += f" pod {','.join(d['pods'])}"
    return text


def _text(x: float, y: float, s: str, size: int = 12, bold: bool = False) -> str:
    weight = " font-weight='bold'" if bold else ""
    return f"<text x='{x:.0f}' y='{y:.0f}' {FONT} font-size='{size}'{weight}>{escape(s)}</text>"


def _rect(x: float, y: float, w: float, h: float, fill: str, stroke: str, sw: float = 1) -> str:
    return (
        f"<rect x='{x:.0f}' y='{y:.0f}' width='{w:.0f}' height='{h:.0f}' rx='6' "
        f"fill='{fill}' stroke='{stroke}' stroke-width='{sw}'/>"
    )


def _width(view: Mapping[str, Any]) -> float:
    """One box width for every root: the longest line fits."""
    lines = [
        (18 * i, _device_text(label, d) if d else label)
        for r in view["roots"]
        for i, label, d in _rows(r)
    ]
    longest = max((ind + CHAR_W * len(t) for ind, t in lines), default=0.0)
    return max(MIN_W, longest + 2 * PAD + 12)


def _root_box(
    root: Mapping[str, Any], x: float, y: float, colour: int, box_w: float
) -> tuple[list[str], float]:
    light, dark = PALETTE[colour % len(PALETTE)]
    rows = _rows(root)
    h = ROW * (len(rows) + 1) + 2 * PAD
    pairable = bool(root.get("pairable"))
    out = [f"<g class='root' id={quoteattr('root-' + str(root['pcieRoot']))}>"]
    out.append(_rect(x, y, box_w, h, light, PAIRABLE if pairable else dark, 4 if pairable else 1.5))
    title = str(root["pcieRoot"]) + ("   pairable: free GPU + free VF" if pairable else "")
    out.append(_text(x + PAD, y + PAD + 14, title, bold=True))
    for i, (indent, label, dev) in enumerate(rows):
        ry = y + PAD + ROW * (i + 1)
        rx = x + PAD + 18 * indent
        if dev is None:
            out.append(_text(rx + 4, ry + 15, label))
            continue
        fill = {"free": "#ffffff", "used": dark}.get(str(dev["state"]), BLOCKED)
        out.append(f"<g class='device' data-device={quoteattr(str(dev['device']))}>")
        out.append(_rect(rx, ry + 2, box_w - 2 * PAD - 18 * indent, ROW - 4, fill, dark))
        out.append(_text(rx + 4, ry + 15, _device_text(label, dev)))
        out.append("</g>")
    out.append("</g>")
    return out, h


def _legend(x: float, y: float) -> list[str]:
    """Swatches: free, used (in its root's colour), blocked, the pairable border."""
    light, dark = PALETTE[0]
    keys = (
        ("free", "#ffffff", dark, 1.0),
        ("used", dark, dark, 1.0),
        ("blocked", BLOCKED, dark, 1.0),
        ("pairable root", light, PAIRABLE, 3.0),
    )
    out = []
    for label, fill, stroke, width in keys:
        out += [_rect(x, y, 28, 16, fill, stroke, width), _text(x + 34, y + 13, label)]
        x += 34 + CHAR_W * len(label) + 18
    return out


def render_svg(view: Mapping[str, Any]) -> str:
    """The SVG document of a topology view."""
    by_numa: dict[Any, list[Mapping[str, Any]]] = {}
    for r in view["roots"]:
        by_numa.setdefault(r["numaNode"], []).append(r)
    body: list[str] = []
    x: float = GAP
    top, height, colour = 40.0, 0.0, 0
    box_w = _width(view)
    for numa, roots in by_numa.items():
        y = top + ROW + PAD
        inner: list[str] = []
        for r in roots:
            box, h = _root_box(r, x + PAD, y, colour, box_w)
            inner += box
            y += h + GAP
            colour += 1
        frame_h = y - top - GAP + PAD
        label = f"NUMA node {numa if numa is not None else '?'}"
        body += [f"<g class='numa' id={quoteattr(f'numa-{numa}')}>"]
        body += [_rect(x, top, box_w + 2 * PAD, frame_h, "none", "#555555", 1.5)]
        body += [_text(x + PAD, top + 18, label, bold=True), *inner, "</g>"]
        height = max(height, top + frame_h)
        x += box_w + 2 * PAD + GAP
    width, height = max(x, LEGEND_X + LEGEND_W), height + GAP
    head = [
        "<?xml version='1.0' encoding='UTF-8'?>",
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}'>",
        f"<title>{escape('patchbay topology of node ' + str(view['node']))}</title>",
        f"<rect width='{width:.0f}' height='{height:.0f}' fill='#ffffff'/>",
        _text(GAP, 26, f"node {view['node']}", 15, True),
        *_legend(LEGEND_X, 12),
    ]
    return "\n".join([*head, *body, "</svg>"]) + "\n"
