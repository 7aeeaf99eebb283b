"""Reading what a run wrote: its logs, tables, step times with their noise, run directory, restarts and timelines."""
