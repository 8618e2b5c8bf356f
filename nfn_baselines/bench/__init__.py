"""The benchmark: its data and protocols, the runs of every model on every condition and seed, the resume store,
the report with its intervals, and the submission files it writes. Uses `nfn_baselines.models`, never the
leaderboard."""
