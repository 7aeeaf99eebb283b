"""The rank-side meters: memory, collectives and their wire bytes, a step's figures, parameter norms, the flight record."""
