"""replay/program.py's string table: coding a batch at once gives the codes one-by-one coding gives."""

from xsim.replay.program import _Table


def test_codes_of_a_batch_equal_coding_each_string_in_order():
    # By hand: "b" and "a" are in the table already (0, 1); new strings take 2, 3, ... in first-seen order;
    # None is -1 and adds nothing.
    table = _Table()
    table.code("b")
    table.code("a")
    names = ["x", "a", None, "x", "y", "b", "y", "", None, ""]
    got = table.codes(names)
    assert got.dtype.name == "int32"
    assert got.tolist() == [2, 1, -1, 2, 3, 0, 3, 4, -1, 4]
    assert table.strings() == ["b", "a", "x", "y", ""]
    one = _Table()
    one.code("b")
    one.code("a")
    assert [one.code(s) for s in names] == got.tolist()
    assert one.strings() == table.strings()


def test_codes_of_an_empty_batch():
    table = _Table()
    assert table.codes([]).tolist() == []
    assert table.strings() == []
