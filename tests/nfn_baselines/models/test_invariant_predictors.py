"""The predictors that respect the symmetry: the invariant statistics, the probe outputs, the STATNNs built on them
and the hybrid are unchanged by random group elements with badly conditioned matrices (float64, hypothesis), while
a transformation that is not a symmetry changes them; STATNN's own statistics are not invariant."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nfn_baselines.models.baselines import FlatPredictor
from nfn_baselines.models.invariant_stats import feature_count, invariant_statistics
from nfn_baselines.models.model import TransformerNFN
from nfn_baselines.models.predictors import PREDICTORS
from nfn_baselines.models.probegen import ProbeGen, batched_probe_logits
from nfn_baselines.models.probe_features import output_feature_count, probe_inputs, probe_logits, probe_statistics
from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec
from small_transformer_zoo.weights.model import ZooTransformer
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.weight_space import BlockWeights, TransformerWeights

ZOO = mnist_spec()
SPECS = st.one_of(
    st.just(ZOO),
    st.builds(ArchitectureSpec, modality=st.just("vision"), num_classes=st.just(3), d_model=st.sampled_from([4, 6]),
              num_heads=st.sampled_from([1, 2, 3]), d_head=st.integers(1, 4), d_mlp=st.sampled_from([3, 5]),
              num_blocks=st.sampled_from([1, 2]), image_size=st.just(8), patch_size=st.just(4)),
)
TEXT = ArchitectureSpec(modality="text", num_classes=4, d_model=6, num_heads=2, d_head=3, d_mlp=5, num_blocks=2,
                        vocab_size=50, max_length=7)
BADLY_CONDITIONED = 1e3


def weights_of(spec: ArchitectureSpec, batch: int, seed: int) -> TransformerWeights:
    params = torch.randn(batch, spec.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return TransformerWeights.from_params(params * 0.3, spec)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def not_a_symmetry(weights: TransformerWeights, seed: int) -> TransformerWeights:
    """W_q of every head mapped by an invertible matrix without the inverse on W_k: QK changes, and the function
    with it (a negative control)."""
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    for block in weights.blocks:
        d_head = block.W_q.shape[-1]
        mix = torch.eye(d_head, dtype=block.W_q.dtype) + 0.5 * torch.randn(d_head, d_head, generator=generator,
                                                                              dtype=block.W_q.dtype)
        blocks.append(BlockWeights(**{**block.as_dict(), "W_q": block.W_q @ mix}))
    return TransformerWeights(weights.spec, blocks, dict(weights.embedding), dict(weights.classifier))


@settings(max_examples=15, deadline=None)
@given(spec=SPECS, seed=st.integers(0, 10_000))
def test_invariant_statistics_are_invariant(spec: ArchitectureSpec, seed: int) -> None:
    weights = weights_of(spec, 3, seed)
    g = sample_group_element(spec, torch.Generator().manual_seed(seed + 1), condition_number=BADLY_CONDITIONED)
    base = invariant_statistics(weights)
    assert base.shape == (3, feature_count(spec))
    assert relative(invariant_statistics(g.act(weights)), base) < 1e-8
    assert relative(invariant_statistics(not_a_symmetry(weights, seed)), base) > 1e-3


def test_the_invariant_predictors_are_invariant_and_the_others_are_not() -> None:
    weights = weights_of(ZOO, 4, 7)
    g = sample_group_element(ZOO, torch.Generator().manual_seed(8), condition_number=BADLY_CONDITIONED)
    models = {"statnn_invariant": FlatPredictor(ZOO, "statnn_invariant"), "nfn_hybrid": TransformerNFN(ZOO, statistics=True),
              "statnn_probe": FlatPredictor(ZOO, "statnn_probe"), "statnn": FlatPredictor(ZOO, "statnn"),
              "probegen": ProbeGen(ZOO, probes=8)}
    for name, model in models.items():
        torch.manual_seed(0)
        model = model.double().eval()
        base = model.forward_logits(weights)
        moved = relative(model.forward_logits(g.act(weights)), base)
        control = relative(model.forward_logits(not_a_symmetry(weights, 9)), base)
        if PREDICTORS[name].invariant:
            assert moved < 1e-8 and control > 1e-4, (name, moved, control)
        else:
            assert moved > 1e-4, (name, moved)


def test_heads_enter_only_through_symmetric_pools() -> None:
    """A head permutation alone changes nothing, though it moves every per-head tensor."""
    weights = weights_of(ZOO, 2, 11)
    swapped = TransformerWeights(ZOO, [BlockWeights(**{k: (v.flip(2) if k in ("W_q", "W_k", "W_v", "W_o") else v)
                                                       for k, v in b.as_dict().items()}) for b in weights.blocks],
                                 dict(weights.embedding), dict(weights.classifier))
    assert not torch.equal(swapped.blocks[0].W_q, weights.blocks[0].W_q)
    assert relative(invariant_statistics(swapped), invariant_statistics(weights)) < 1e-12


@settings(max_examples=10, deadline=None)
@given(spec=st.one_of(SPECS, st.just(TEXT)), seed=st.integers(0, 10_000))
def test_probe_statistics_are_invariant(spec: ArchitectureSpec, seed: int) -> None:
    """The network's function is what the group keeps, so its outputs on the probes are unchanged."""
    weights = weights_of(spec, 3, seed)
    g = sample_group_element(spec, torch.Generator().manual_seed(seed + 1), condition_number=BADLY_CONDITIONED)
    base = probe_statistics(weights, count=32)
    assert base.shape == (3, output_feature_count(spec))
    assert relative(probe_statistics(g.act(weights), count=32), base) < 1e-8
    assert relative(probe_statistics(a_new_classifier_output(weights, seed), count=32), base) > 1e-4


def a_new_classifier_output(weights: TransformerWeights, seed: int) -> TransformerWeights:
    """The classifier's last layer moved by a random matrix: the outputs on the probes change whatever the
    attention does (a negative control; at d_head = 1 a mix of W_q alone only scales the attention logits, which
    can leave the outputs nearly as they were)."""
    generator = torch.Generator().manual_seed(seed)
    classifier = {k: v + torch.randn(v.shape, generator=generator, dtype=v.dtype) if k.endswith("fc2.weight") else v
                  for k, v in weights.classifier.items()}
    return TransformerWeights(weights.spec, list(weights.blocks), dict(weights.embedding), classifier)


def test_probe_logits_are_the_networks_own_outputs() -> None:
    """Each checkpoint's probe logits are what `ZooTransformer` computes with its state_dict (images), and, for text,
    what it computes from the token ids when the embeddings are those ids' rows of the word table."""
    weights = weights_of(ZOO, 2, 3)
    probes = probe_inputs(ZOO, 5, dtype=torch.float64)
    network = ZooTransformer(ZOO).double().eval()
    network.load_state_dict(weights.state_dict(1), strict=False)
    assert torch.allclose(probe_logits(weights, probes)[1], network(probes), atol=1e-12)
    three = weights_of(ZOO, 3, 4)
    torch.testing.assert_close(probe_logits(three, probes, chunk=2), probe_logits(three, probes),
                               rtol=1e-12, atol=1e-12)

    text = ZooTransformer(TEXT).double().eval()
    text.load_state_dict(weights_of(TEXT, 1, 4).state_dict(0), strict=False)
    text.embedding.table = torch.randn(TEXT.vocab_size, TEXT.d_model, dtype=torch.float64)
    ids = torch.randint(1, TEXT.vocab_size, (3, TEXT.max_length), generator=torch.Generator().manual_seed(5))
    assert torch.allclose(text.forward_embedded(text.embedding.table[ids]), text(ids), atol=1e-12)
    assert probe_inputs(TEXT, 4).shape == (4, TEXT.max_length, TEXT.d_model)
    assert torch.equal(probe_inputs(ZOO, 4), probe_inputs(ZOO, 4))


@settings(max_examples=10, deadline=None)
@given(spec=st.one_of(SPECS, st.just(TEXT)), seed=st.integers(0, 10_000), group=st.sampled_from(["paper", "all"]))
def test_probegen_is_invariant_under_the_full_group(spec: ArchitectureSpec, seed: int, group: str) -> None:
    """Under a random element of the paper's group, and of it with the interface permutations (`--randomize all`),
    the prediction stays within float round-off; a change that is not a symmetry moves it."""
    from small_transformer_zoo.weights.symmetry import sample_interface_element

    weights = weights_of(spec, 3, seed)
    torch.manual_seed(seed)
    model = ProbeGen(spec, probes=6).double().eval()
    base = model.forward_logits(weights)
    moved = sample_group_element(spec, torch.Generator().manual_seed(seed + 1),
                                 condition_number=BADLY_CONDITIONED).act(weights)
    if group == "all":
        moved = sample_interface_element(spec, torch.Generator().manual_seed(seed + 2)).act(moved)
    assert relative(model.forward_logits(moved), base) < 1e-8
    assert relative(model.forward_logits(a_new_classifier_output(weights, seed)), base) > 1e-6


def test_probegen_reads_every_checkpoint_on_the_same_learned_probes() -> None:
    """The batched forward is each network's own output, and the probes carry gradients back to the generator."""
    weights = weights_of(ZOO, 3, 5)
    model = ProbeGen(ZOO, probes=4).double()
    probes = model.probes()
    logits = batched_probe_logits(weights, probes)
    network = ZooTransformer(ZOO).double().eval()
    network.load_state_dict(weights.state_dict(2), strict=False)
    assert torch.allclose(logits[2], network(probes), atol=1e-10)
    model.forward_logits(weights).sum().backward()
    assert model.codes.grad is not None and model.codes.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.generator.parameters())


@settings(max_examples=8, deadline=None)
@given(spec=st.one_of(SPECS, st.just(TEXT)), seed=st.integers(0, 10_000))
def test_the_interface_nfn_is_invariant_under_randomize_all(spec: ArchitectureSpec, seed: int) -> None:
    """`--randomize all` (every checkpoint moved by its own element of the paper's group and of the interface
    permutations) leaves `transformer_nfn_interfaces` within float round-off in float64; it moves today's
    Transformer-NFN, which reads the interfaces by position, and a change that is not a symmetry moves both."""
    from small_transformer_zoo.weights.symmetry import randomize_params

    weights = weights_of(spec, 3, seed)
    params = weights.to_params()
    moved = TransformerWeights.from_params(randomize_params(params, spec, "all", [f"c{i}" for i in range(3)],
                                                            seed=seed), spec)
    torch.manual_seed(seed)
    extended = PREDICTORS["transformer_nfn_interfaces"].build(spec, PREDICTORS["transformer_nfn_interfaces"].settings,
                                                              1).double().eval()
    torch.manual_seed(seed)
    plain = PREDICTORS["transformer_nfn"].build(spec, PREDICTORS["transformer_nfn"].settings, 1).double().eval()
    base = extended.forward_logits(weights)
    assert relative(extended.forward_logits(moved), base) < 1e-8
    assert relative(plain.forward_logits(moved), plain.forward_logits(weights)) > 1e-6
    assert relative(extended.forward_logits(not_a_symmetry(weights, seed)), base) > 1e-6
    assert torch.equal(extended.prepare(params)[0], extended.inputs(params)[0])


def test_probegen_trains_with_its_seeds_batched_and_leaves_the_random_stream_alone() -> None:
    """Several seeds of ProbeGen train together (the trainer's vmap over models), and a forward pass draws nothing
    from torch's global generator: the network the weights are passed to is made once, from a forked one."""
    from nfn_baselines.models.train import TrainConfig, train_predictors

    generator = torch.Generator().manual_seed(0)
    rows = lambda n: (torch.randn(n, ZOO.n_params, generator=generator) * 0.1,  # noqa: E731
                      torch.rand(n, generator=generator))
    models = [ProbeGen(ZOO, probes=4) for _ in range(2)]
    state = torch.get_rng_state()
    models[0].forward_logits(weights_of(ZOO, 2, 1).to(torch.float32))
    assert torch.equal(torch.get_rng_state(), state)
    results = train_predictors(models, ZOO, rows(12), rows(6), [TrainConfig(epochs=2, warmup_epochs=0, seed=s)
                                                                for s in range(2)])
    assert len(results) == 2 and all(r.best_epoch in (1, 2) for r in results)
