"""The predictors: Transformer-NFN (layers, model, reference), the baselines and floors, their registry
(`predictors`), their training (`train`), and the targets and metrics they are fitted and scored by. Imports
neither `nfn_baselines.bench` nor `nfn_baselines.leaderboard`."""
