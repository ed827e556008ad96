"""A bar chart as SVG text, drawn on the server: no script, no library, no CDN. Pure."""
from html import escape

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 150, 56, 20, 10


def _short(value):
    if value >= 1e9:
        return f"{value / 1e9:.1f}G"
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:g}" if isinstance(value, float) else str(value)


def bars(points, title, unit=""):
    """Return an <svg> of one bar per (label, value), the largest value marked on the axis and
    every bar's label and value in its tooltip. points: [(label, value)], oldest first."""
    top = max((v for _, v in points), default=0)
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    step = plot_w / max(len(points), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'width="{WIDTH}" height="{HEIGHT}" aria-label="{escape(title)}">',
           f'<title>{escape(title)}</title>',
           f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 4}" y2="{TOP + plot_h}" stroke="#999"/>',
           f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end" font-size="10">{escape(_short(top))}{escape(unit)}</text>',
           f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" font-size="10">0</text>']
    for i, (label, value) in enumerate(points):
        h = 0 if not top else plot_h * value / top
        x = LEFT + i * step
        out.append(f'<rect x="{x + step * 0.1:.1f}" y="{TOP + plot_h - h:.1f}" width="{max(step * 0.8, 1):.1f}" '
                   f'height="{h:.1f}" fill="#3b6ea5"><title>{escape(label)}: {escape(_short(value))}{escape(unit)}'
                   f'</title></rect>')
    if points:
        out.append(f'<text x="{LEFT}" y="{HEIGHT - 4}" font-size="10">{escape(points[0][0])}</text>')
        out.append(f'<text x="{WIDTH - 4}" y="{HEIGHT - 4}" text-anchor="end" font-size="10">'
                   f'{escape(points[-1][0])}</text>')
    out.append("</svg>")
    return "".join(out)
