"""Tic-Tac-Toe against a scripted opponent. A move is one digit naming a free cell (1-9, row-major).

Two observation formats (`show`):

    "board"                         "moves" (`earl run`'s default)
    tic-tac-toe x                   tic-tac-toe x
    123|456|789                     (empty: no move yet)
    -> agent answers "5"            -> agent answers "5"
    12o|4x6|789                     x5 o3
    -> agent answers "1"            -> agent answers "1"
    x2o|4x6|7o9                     x5 o3 x1 o8

"board" draws free cells as their digits, so every earlier board in the context still shows a
now-taken cell as free; "moves" lists the moves so far, so only taken cells appear as digits
and no observation contradicts a later one. The tiny model learns legality from either when
taught directly; under RL with the legality term (`trainer.legal_coef`) "moves" learned faster
(docs/cpu/learning/README.md, session 3).

    python -c "from earl.runtime.envs import make_env; e = make_env('tic-tac-toe'); print(e.reset(1))"
"""

from __future__ import annotations

from earl.runtime.envs.base import BoardGameEnv, check_choice

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
SHOW_MODES = ("moves", "board")


class TicTacToe(BoardGameEnv):
    max_new_tokens = 1
    stop = ("\n",)
    title = "tic-tac-toe"
    actions = tuple("123456789")

    def __init__(self, *, show: str = "board", **game_options):
        super().__init__(**game_options)
        self.show = check_choice("show", show, SHOW_MODES)
        self.moves: list[tuple[str, int]] = []  # (player, cell) in play order

    def new_board(self) -> list[str]:
        self.moves = []
        return [""] * 9

    def legal_moves(self) -> list[int]:
        return [i + 1 for i, c in enumerate(self.board) if not c]

    def apply(self, move: int, player: str) -> None:
        assert not self.board[move - 1], f"cell {move} is taken"
        self.board[move - 1] = player
        self.moves.append((player, move))

    def winner(self) -> str | None:
        for a, b, c in LINES:
            if self.board[a] and self.board[a] == self.board[b] == self.board[c]:
                return self.board[a]
        return "draw" if all(self.board) else None

    def render(self) -> str:
        if self.show == "moves":
            return " ".join(f"{p}{m}" for p, m in self.moves)
        cells = [c or str(i + 1) for i, c in enumerate(self.board)]
        return "|".join("".join(cells[r * 3:r * 3 + 3]) for r in range(3))

    def parse_move(self, text: str) -> int | None:
        s = text.split("\n", 1)[0].strip()
        return int(s) if len(s) == 1 and s in "123456789" else None
