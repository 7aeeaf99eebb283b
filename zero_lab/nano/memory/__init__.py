"""Memory accounting: the bytes each rank holds per ZeRO stage, by nano's documented formula
(`memory_formula`), and the same categories counted from an optimizer's live tensors (`optimizer_memory`).
"""
