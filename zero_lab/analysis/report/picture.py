"""Pictures a reader can draw again: a PNG that carries the numbers it shows, and whose bytes depend
only on those numbers and on matplotlib's version.

The course (docs/learn/) commits the pictures `zero-lab explain --plot`, `estimate --plot` and
`checkpoint inspect --plot` draw, and a test draws each again and compares. So a picture is drawn
with one bundled font (DejaVu Sans, shipped inside matplotlib), no timestamp and no software tag,
and its data go into the PNG itself, as JSON in a text chunk named "zero-lab": a test can compare
the numbers whatever matplotlib draws, and the pixels where matplotlib's version is the same.

    OP_COLOURS                                      each collective's colour, the same in every picture
    draw_picture(path, width, height, draw, data)   the PNG, `data` and matplotlib's version inside it
    picture_data(path)                              {"data": ..., "matplotlib": "3.x"} read back
    picture_pixels(path)                            its pixels, as a reader sees them
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

MB = 2**20
KEY = "zero-lab"
# One colour per collective, in every picture that draws one (explain's wire bytes, a trace's timeline):
# an all-gather is the same colour wherever a reader meets it.
OP_COLOURS = {"all_reduce": "#8C8C8C", "reduce_scatter": "#DD8452", "all_gather": "#8172B3", "all_to_all": "#CCB974",
              "broadcast": "#64B5CD", "reduce": "#937860"}
STYLE = {"font.family": "DejaVu Sans", "font.size": 8, "axes.titlesize": 9, "hatch.linewidth": 0.6}
DPI = 100


def draw_picture(path: Path, width: float, height: float, draw: Callable, data: dict) -> Path:
    """Draw `draw(figure)` on a new Figure (Agg, no pyplot: no GUI, no global registry) with the
    picture's fonts, and write the PNG: `data` (plain JSON: the numbers drawn) in its "zero-lab"
    chunk, no date, no software tag. Fonts are read when text is made, so all of it runs in STYLE."""
    import matplotlib
    from matplotlib.figure import Figure

    text = json.dumps({"data": data, "matplotlib": matplotlib.__version__}, sort_keys=True)
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(width, height), dpi=DPI)
        draw(figure)
        figure.savefig(path, dpi=DPI, metadata={"Software": None, KEY: text})
    return path


def picture_data(path: Path) -> dict:
    """The "zero-lab" chunk of a PNG save_picture wrote: {"data": ..., "matplotlib": version}."""
    from PIL import Image

    with Image.open(path) as image:
        text = image.text.get(KEY)
    if text is None:
        raise ValueError(f"{path} carries no zero-lab data (not drawn by zero-lab)")
    return json.loads(text)


def picture_pixels(path: Path):
    """The PNG's pixels as an RGBA array (what a reader sees)."""
    import numpy
    from PIL import Image

    with Image.open(path) as image:
        return numpy.asarray(image.convert("RGBA"))
