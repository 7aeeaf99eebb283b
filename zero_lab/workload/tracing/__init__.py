"""`--trace` and `explain --measure` inside a rank: the timeline, the memory history, the engines' moments."""
