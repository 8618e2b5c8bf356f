"""The benchmark's protocols, by name (docs/design.md section 10; `bench_data` carries them out).

- `all-checkpoints` (the default): every selected checkpoint of the training split is a training example; tau
  above an accuracy threshold is measured on the test checkpoints above it.
- `paper`: the protocol of the paper's Table 1. One checkpoint per run, the one saved after a given epoch (by
  default the epoch that plays the role of the paper's 75 of 100 epochs: three quarters of the zoo's training), and
  for each accuracy threshold the zoo is filtered first, then trained, selected and tested on what passed, within
  the zoo's own run splits (the original code's `cut_off`, without its per-file shuffle).
"""

PROTOCOLS = ("all-checkpoints", "paper")
PAPER_EPOCH_SHARE = 0.75  # the paper's epoch 75 of 100
