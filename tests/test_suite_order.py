"""`make test`'s xdist order names real files: a renamed or moved long file would otherwise drop
silently to the back of the queue and run alone at the end."""
from pathlib import Path

from tests.conftest import LONGEST_FIRST

REPO = Path(__file__).resolve().parents[1]


def test_every_longest_first_file_exists():
    missing = [path for path in LONGEST_FIRST if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py's LONGEST_FIRST names files that are gone: {missing}"
