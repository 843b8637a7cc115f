"""The console's small text helpers."""

from lstmablate.console import count


def test_count_says_the_noun_in_the_plural_unless_there_is_one():
    assert count(1, "run") == "1 run"
    assert [count(n, "run") for n in (0, 2, 15)] == ["0 runs", "2 runs", "15 runs"]
    assert count(2, "scores file") == "2 scores files"
    assert count(3, "child", "children") == "3 children" and count(1, "child", "children") == "1 child"
