"""The pieces of ``bench/fuzz.py`` (its face: arguments, output, the names tests load):
``mutations`` (how a file is corrupted), ``datasets`` and ``delta_tables`` (the pristine
MDS datasets and Delta tables, and the cases planned over their files), ``targets`` (each
way a corrupted copy is read, as a user would), ``delta_verdicts`` (the Delta changes no
reader can tell from the original), ``worker`` (one process running cases and judging
their outcomes) and ``driver`` (the parent: workers, timeouts, crashes confirmed alone)."""
