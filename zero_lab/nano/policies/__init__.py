"""Stage 3's policies, decided once outside the mechanism, as pure arithmetic or from the model:
which parameters form a unit (`unit_policy`, `stage3_units`) and when a unit is fetched and
released (`fetch_policy`). `initialize` applies them; stage 3's gathering follows them.
"""
