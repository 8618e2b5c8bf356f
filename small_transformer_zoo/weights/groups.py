"""The names of the symmetry groups a benchmark can randomize checkpoints by (`symmetry.randomize_params`), kept
apart from torch so the command line lists them without loading it."""

RANDOMIZE_GROUPS = ("paper-group", "interfaces", "all")
