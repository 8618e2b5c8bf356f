"""Workflows that join the packages: they sit above `small_transformer_zoo`, `builders` and `nfn_baselines` and
use all three, while none of those imports this (docs/design.md section 1)."""
