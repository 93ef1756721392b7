"""Data-parallel evaluation's split: every question goes to exactly one replica, in order, shares even."""
import pytest

from ascend_engine.evaluate.sharding import share


@pytest.mark.parametrize("n,dp", [(8, 2), (7, 3), (1, 2), (0, 4), (5, 1)])
def test_shares_cover_every_question_once_in_order(n, dp):
    questions = list(range(n))
    shares = [share(questions, rank, dp) for rank in range(dp)]
    assert [q for s in shares for q in s] == questions
    assert max(map(len, shares)) - min(map(len, shares)) <= 1

