"""Tic-Tac-Toe against a scripted opponent. The board shows free cells as their number, so a
move is one digit naming a free cell:

    tic-tac-toe x        (first observation: the agent plays x)
    1x3|4o6|789          (rows separated by '|')
    -> agent answers "5"

    python -c "from earl.runtime.envs import make_env; e = make_env('tic-tac-toe'); print(e.reset(1))"
"""

from __future__ import annotations

from earl.runtime.envs.base import BoardGameEnv

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


class TicTacToe(BoardGameEnv):
    max_new_tokens = 1
    stop = ("\n",)
    title = "tic-tac-toe"

    def new_board(self) -> list[str]:
        return [""] * 9

    def legal_moves(self) -> list[int]:
        return [i + 1 for i, c in enumerate(self.board) if not c]

    def apply(self, move: int, player: str) -> None:
        assert not self.board[move - 1], f"cell {move} is taken"
        self.board[move - 1] = player

    def winner(self) -> str | None:
        for a, b, c in LINES:
            if self.board[a] and self.board[a] == self.board[b] == self.board[c]:
                return self.board[a]
        return "draw" if all(self.board) else None

    def render(self) -> str:
        cells = [c or str(i + 1) for i, c in enumerate(self.board)]
        return "|".join("".join(cells[r * 3:r * 3 + 3]) for r in range(3))

    def parse_move(self, text: str) -> int | None:
        s = text.split("\n", 1)[0].strip()
        return int(s) if len(s) == 1 and s in "123456789" else None
