"""`make test`'s xdist order names real files: a renamed or moved long file would otherwise drop
silently to the back of the queue and run alone at the end."""
from pathlib import Path

from tests.conftest import LONGEST_FIRST

REPO = Path(__file__).resolve().parents[1]


def test_every_longest_first_file_exists():
    missing = [path for path in LONGEST_FIRST if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py's LONGEST_FIRST names files that are gone: {missing}"


def test_the_order_is_read_from_a_junit_report(tmp_path):
    """A file's test seconds are summed over its tests (in classes too); files under 10 s are left out."""
    from tests.suite_durations import file_seconds, longest_first

    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.cli.test_a" name="x" time="6.0"/>'
                      '<testcase classname="tests.cli.test_a.TestGroup" name="y" time="5.5"/>'
                      '<testcase classname="tests.nano.test_b" name="z" time="30.2"/>'
                      '<testcase classname="tests.test_c" name="w" time="2"/>'
                      '</testsuite></testsuites>')
    assert file_seconds(report) == {"tests/cli/test_a.py": 11.5, "tests/nano/test_b.py": 30.2, "tests/test_c.py": 2.0}
    assert list(longest_first(file_seconds(report)).items()) == [("tests/nano/test_b.py", 30),
                                                                 ("tests/cli/test_a.py", 12)]
    assert LONGEST_FIRST[0] in longest_first({LONGEST_FIRST[0]: 60.0})
