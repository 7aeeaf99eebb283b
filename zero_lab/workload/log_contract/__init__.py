"""The log contract (docs/log-format.md): the `[tag] key=value` lines a rank prints and every reader parses.

    log_lines        the one writer and the one tokenizer of a contract line
    contract_lines   the header lines (`[zero]`, `[model]`) and how rank 0 prints a line
"""
