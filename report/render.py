"""Pages: prose and tables drawn as matplotlib figures (A4 landscape), appended to a PdfPages."""
from __future__ import annotations

import textwrap
from typing import Iterable, Sequence, Union

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .figures import PAGE  # noqa: E402
from .tables import Table  # noqa: E402

# A block of prose: ("h", heading) | ("p", paragraph) | ("b", bullet) | ("m", monospace line) | ("gap", "")
Block = tuple[str, str]
STYLE = {  # kind -> (font size, family, wrap width in characters, indent in inches)
    "h": (13, "sans-serif", 110, 0.0),
    "p": (9.5, "sans-serif", 158, 0.0),
    "b": (9.5, "sans-serif", 152, 0.25),
    "m": (7.2, "monospace", 168, 0.0),
    "gap": (6, "sans-serif", 1, 0.0),
}
MARGIN = 0.55  # inches


class Report:
    """Collects pages into one PDF and counts them."""

    def __init__(self, path: str):
        # No creation date (matplotlib writes the build time otherwise): the same results give the same bytes, so
        # rebuilding the report leaves the committed PDF unchanged unless its content changed.
        self.pdf = PdfPages(path, metadata={"CreationDate": None})
        self.pages = 0
        self.titles: list[str] = []
        self._page_title = ""

    def add(self, fig: Figure, title: str) -> None:
        self.pages += 1
        fig.text(0.985, 0.012, f"{self.pages}", ha="right", va="bottom", fontsize=8, color="#666666")
        self.pdf.savefig(fig)
        plt.close(fig)
        self.titles.append(title)

    def close(self) -> None:
        info = self.pdf.infodict()
        info["Title"] = "hybrid_engine: technical report"
        self.pdf.close()

    def text(self, title: str, blocks: Iterable[Block]) -> None:
        """Prose pages: wraps every block and starts a new page when one is full."""
        lines: list[tuple[str, str]] = []
        for kind, text in blocks:
            size, family, width, indent = STYLE[kind]
            if kind == "gap":
                lines.append(("gap", ""))
                continue
            if kind == "m":
                wrapped = textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False) or [""]
            else:
                wrapped = textwrap.wrap(text, width) or [""]
            for i, line in enumerate(wrapped):
                lines.append((kind, ("• " if kind == "b" and i == 0 else "  " if kind == "b" else "") + line))
            if kind in ("p", "b", "h"):
                lines.append(("gap", ""))
        for i in range(len(lines) - 1, 0, -1):  # space before a heading that follows a monospace line
            if lines[i][0] == "h" and lines[i - 1][0] == "m":
                lines.insert(i, ("gap", ""))
        while lines and lines[-1][0] == "gap":
            lines.pop()
        page_title = title
        while lines:
            while lines and lines[0][0] == "gap":
                lines.pop(0)
            fig = plt.figure(figsize=PAGE)
            fig.text(MARGIN / PAGE[0], 1 - 0.5 / PAGE[1], page_title, fontsize=16, weight="bold", va="top")
            y = PAGE[1] - 1.05  # inches from the bottom
            while lines and y > 0.5:
                if lines[0][0] == "h" and y < 0.5 + 3 * 10 * 1.45 / 72 + 0.3:
                    break  # no heading at the foot of a page
                kind, line = lines.pop(0)
                size, family, _, indent = STYLE[kind]
                if kind != "gap":
                    fig.text((MARGIN + indent) / PAGE[0], y / PAGE[1], line, fontsize=size, family=family, va="top",
                             weight="bold" if kind == "h" else "normal")
                y -= size * 1.42 / 72 if kind != "gap" else 0.08
            self.add(fig, page_title)
            page_title = f"{title} (continued)"

    def tables(self, tables: Sequence[Table], fontsize: float = 7.5) -> None:
        """Tables one after another, several to a page where they fit, a long one split over pages (its first
        note, the source, under every part). Grey rows are runs without numbers."""
        row_h, bottom, fig, y = fontsize * 1.85 / 72, 0.4, None, 0.0
        for table in tables:
            notes = [textwrap.wrap(n, 160) for n in table.notes]
            rows, shade, part = list(table.rows), list(table.shade), 0
            while True:
                last_notes = sum(map(len, notes)) * 0.16 + 0.3
                fit = int((y - bottom - 0.45 - last_notes) / row_h) - 1 if fig is not None else 0
                fresh = int((PAGE[1] - 0.45 - bottom - 0.45 - last_notes) / row_h) - 1
                if fig is None or fit < min(4, len(rows)) or (part == 0 and fit < len(rows) <= fresh
                                                               and y < PAGE[1] - 0.5):
                    if fig is not None:
                        self.add(fig, self._page_title)
                    fig, y = plt.figure(figsize=PAGE), PAGE[1] - 0.45
                    self._page_title = table.title
                    continue
                take = rows[:fit]
                title = table.title + (f" (part {part + 1})" if part or len(rows) > fit else "")
                fig.text(MARGIN / PAGE[0], y / PAGE[1], title, fontsize=12, weight="bold", va="top")
                y -= 0.4
                y = self._draw_table(fig, table, take, shade[:len(take)], y, row_h, fontsize)
                rows, shade, part = rows[len(take):], shade[len(take):], part + 1
                for lines in (notes if not rows else notes[:1]):
                    for line in lines:
                        fig.text(MARGIN / PAGE[0], y / PAGE[1], line, fontsize=7.5, va="top", color="#333333")
                        y -= 0.16
                y -= 0.3
                if not rows:
                    break
                self.add(fig, self._page_title)
                fig, y = plt.figure(figsize=PAGE), PAGE[1] - 0.45
        if fig is not None:
            self.add(fig, self._page_title)

    @staticmethod
    def _draw_table(fig: Figure, table: Table, rows: list, shade: list, top: float, row_h: float,
                    fontsize: float) -> float:
        """Draw rows under `top` (inches from the bottom); returns the y below the table."""
        lengths = [max([len(c)] + [len(r[j]) for r in table.rows]) for j, c in enumerate(table.columns)]
        widths = [max(n, 3) + 2 for n in lengths]
        total = sum(widths)
        table_w = min(PAGE[0] - 2 * MARGIN, total * fontsize * 0.62 / 72)
        height = row_h * (len(rows) + 1)
        ax = fig.add_axes((MARGIN / PAGE[0], (top - height) / PAGE[1], table_w / PAGE[0], height / PAGE[1]))
        ax.axis("off")
        if not rows:
            ax.text(0, 1, "(no rows in this results set)", fontsize=10, va="top")
            return top - height - 0.15
        tab = ax.table(cellText=rows, colLabels=table.columns, colWidths=[w / total for w in widths],
                       cellLoc="left", colLoc="left", bbox=(0, 0, 1, 1))
        tab.auto_set_font_size(False)
        tab.set_fontsize(fontsize)
        for (r, c), cell in tab.get_celld().items():
            cell.set_linewidth(0.3)
            cell.PAD = 0.6 / widths[c]  # about half a character, whatever the column's width
            if r == 0:
                cell.set_facecolor("#dfe7f2")
                cell.set_text_props(weight="bold")
            elif shade[r - 1]:
                cell.set_facecolor("#eeeeee")
                cell.get_text().set_color("#555555")
        return top - height - 0.15

    def figure(self, fig: Figure, title: str, caption: Union[str, Sequence[str], None] = None) -> None:
        if caption:
            lines = [caption] if isinstance(caption, str) else list(caption)
            y = 0.055
            for text in lines:
                for line in textwrap.wrap(text, 170):
                    fig.text(MARGIN / PAGE[0], y, line, fontsize=8, va="top", color="#333333")
                    y -= 0.02
        self.add(fig, title)
