"""One optimizer step explained on paper: the walk-through, its tables and picture, its check, what stage 3
keeps gathered layer by layer, the reading path."""
