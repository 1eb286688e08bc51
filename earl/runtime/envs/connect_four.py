"""Connect Four (6 rows x 7 columns) against a scripted opponent. The board is printed top row
first, rows separated by '|', '.' for empty; a move is one digit 1-7 naming a column that is not
full; four in a row (horizontal, vertical, diagonal) wins.

    python -c "from earl.runtime.envs import make_env; e = make_env('connect-four'); print(e.reset(0))"
"""

from __future__ import annotations

from earl.runtime.envs.base import BoardGameEnv

ROWS, COLS = 6, 7


class ConnectFour(BoardGameEnv):
    max_new_tokens = 1
    stop = ("\n",)
    title = "connect-four"
    actions = tuple("1234567")

    def new_board(self) -> list[str]:
        return ["."] * (ROWS * COLS)  # row 0 is the top row

    def legal_moves(self) -> list[int]:
        return [c + 1 for c in range(COLS) if self.board[c] == "."]

    def apply(self, move: int, player: str) -> None:
        col = move - 1
        for row in range(ROWS - 1, -1, -1):
            if self.board[row * COLS + col] == ".":
                self.board[row * COLS + col] = player
                return
        raise AssertionError(f"column {move} is full")

    def winner(self) -> str | None:
        b = self.board
        for r in range(ROWS):
            for c in range(COLS):
                p = b[r * COLS + c]
                if p == ".":
                    continue
                for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                    rr, cc = r + 3 * dr, c + 3 * dc
                    if 0 <= rr < ROWS and 0 <= cc < COLS and all(
                            b[(r + k * dr) * COLS + c + k * dc] == p for k in range(1, 4)):
                        return p
        return "draw" if "." not in b else None

    def render(self) -> str:
        return "|".join("".join(self.board[r * COLS:(r + 1) * COLS]) for r in range(ROWS))

    def parse_move(self, text: str) -> int | None:
        s = text.split("\n", 1)[0].strip()
        return int(s) if len(s) == 1 and s in "1234567" else None
