"""One optimizer step explained on paper: the walk-through, its tables and picture, its check, the reading path."""
