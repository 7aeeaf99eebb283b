"""`deepspeed.checkpoint`: helpers clients use when they save weights themselves."""
