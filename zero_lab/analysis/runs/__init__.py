"""Reading what a run wrote: its logs, tables, run directory, restarts and timelines; how fast it
trained is the sub-room `speed/`."""
