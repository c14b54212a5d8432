"""Text on a fixed cell grid, filled row by row: words wrap whole, a run longer than a row breaks."""

from __future__ import annotations

from .fonts import BLANK


class TextLayout:
    """Cells of one frame's text, filled row by row: words wrap whole, long runs break."""

    def __init__(self, cols: int, wide_left):
        self.cols, self.wide_left = cols, wide_left
        self.tiles: list[int] = []
        self.owner: list[int] = []
        self.col = 0
        self.soft = False  # the current row began by wrapping, not at a newline
        self.word_tiles: list[int] = []
        self.word_owner: list[int] = []
        self.newline(False)

    def newline(self, wrapped: bool) -> None:
        self.tiles.extend([BLANK] * self.cols)
        self.owner.extend([-1] * self.cols)
        self.col, self.soft = 0, wrapped

    def place(self, tl, ow, start: int, stop: int) -> None:
        """Put cells tl[start:stop] at the cursor; slices, not cells, go in one row at a time."""
        cols = self.cols
        while start < stop:
            if self.col >= cols:
                self.newline(True)
            take = min(cols - self.col, stop - start)
            if take < stop - start and tl[start + take - 1] in self.wide_left:
                take -= 1  # both halves of a wide character stay on one row
                if take == 0:
                    self.newline(True)
                    continue
            at = len(self.tiles) - cols + self.col
            self.tiles[at:at + take] = tl[start:start + take]
            self.owner[at:at + take] = ow[start:start + take]
            self.col += take
            start += take

    def add_word(self, chunk, pos: int) -> None:
        self.word_tiles.extend(chunk)
        self.word_owner.extend([pos] * len(chunk))

    def flush(self) -> None:
        """Place the pending word: on a fresh row if it fits there, else broken at token boundaries."""
        tiles, owner, n = self.word_tiles, self.word_owner, len(self.word_tiles)
        if not n:
            return
        if self.col + n > self.cols and 0 < self.col and n <= self.cols:
            self.newline(True)
        start = 0
        while n - start > self.cols - self.col:
            room = self.cols - self.col
            if room <= 1:
                self.newline(True)
                continue
            cut = next((j for j in range(start + room, start + room // 2, -1) if owner[j] != owner[j - 1]),
                       start + room)
            self.place(tiles, owner, start, cut)
            start = cut
            if self.col:  # place() may already have wrapped to keep a wide character whole
                self.newline(True)
        self.place(tiles, owner, start, n)
        tiles.clear()
        owner.clear()
