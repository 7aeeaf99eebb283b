"""Predicting memory: model states by formula, a step's peak, activations, and whether a run fits."""
