"""Configuration: where omnigent's files live and what the environment tunes.

`dirs` (the data dir and HOME's `.omnigent`, private files, one-line disk
errors), `logs` (where each process logs, pruned) and `tuning` (recovery
knobs from `OMNIGENT_*`, checked before anything starts). The bottom
layer: these import nothing else of omnigent, and nothing heavy, because
the cold start of `omnigent run` reads them first. Kept empty on purpose.
"""
