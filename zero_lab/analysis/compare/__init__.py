"""Judging runs against each other: deltas and loss gaps, the verdict's rules, where runs part."""
