"""Transformer-NFN speed (fast layers against the per-term reference) and equivariance error.

    python benchmarks/bench_nfn.py

Forward + backward throughput of the paper-setting model's encoder branch (E 1->10, ReLU, I 10->10) with the
grouped-term layers against the one-einsum-per-term reference (`nfn_baselines/reference.py`, same parameters),
at batch 16 and 256, plus the whole model's throughput and parameter count, and the equivariance errors.
"""

from __future__ import annotations

import time

import torch

from common import row  # noqa: F401  (sets up the import path)

from nfn_baselines.models.model import TransformerNFN, count_parameters
from nfn_baselines.models.reference import reference_equivariant, reference_invariant
from nfn_baselines.models.weight_stack import BlockStack
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.weight_space import TransformerWeights

SPEC = mnist_spec()


def throughput(step, batch: int, min_seconds: float = 2.0) -> float:
    step()  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds or count < 3:
        step()
        count += 1
    return batch * count / (time.perf_counter() - start)


def main() -> None:
    torch.manual_seed(0)
    model = TransformerNFN(SPEC, channels=10, hidden=10)
    encoder = model.encoder
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"paper-setting Transformer-NFN (c=10, hidden 10, 1 equivariant layer): {count_parameters(model):,} "
          f"parameters (encoder branch {count_parameters(encoder):,})\n")

    def fast(stack: BlockStack) -> torch.Tensor:
        return encoder(stack)

    def reference(stack: BlockStack) -> torch.Tensor:
        hidden = reference_equivariant(encoder.layers[0], stack).map_mlp(torch.relu)
        return reference_invariant(encoder.invariant, hidden)

    print("forward + backward, samples/s (encoder branch; whole model for the last column)")
    print(f"  {'batch':>5} {'reference':>12} {'fast':>12} {'speed-up':>9} {'whole model':>12}")
    for batch in (16, 256):
        params = torch.randn(batch, SPEC.n_params) * 0.2
        stack = BlockStack.from_weights(TransformerWeights.from_params(params, SPEC))
        check = (fast(stack) - reference(stack)).abs().max().item()
        assert check < 1e-3, check
        rates = {}
        for name, fn in (("reference", reference), ("fast", fast)):
            def step(fn=fn) -> None:
                encoder.zero_grad()
                fn(stack).square().sum().backward()
            rates[name] = throughput(step, batch)

        def model_step() -> None:
            model.zero_grad()
            model(TransformerWeights.from_params(params, SPEC)).sum().backward()
        whole = throughput(model_step, batch)
        print(f"  {batch:>5} {rates['reference']:>12,.0f} {rates['fast']:>12,.0f} "
              f"{rates['fast'] / rates['reference']:>8.2f}x {whole:>12,.0f}")

    print("\nequivariance error, max relative, random group elements (condition number 10), zoo-scale weights")
    for dtype in (torch.float32, torch.float64):
        m = TransformerNFN(SPEC).to(dtype)
        worst_layer = worst_model = 0.0
        for seed in range(5):
            weights = TransformerWeights.from_params(torch.randn(8, SPEC.n_params, dtype=dtype) * 0.2, SPEC)
            g = sample_group_element(SPEC, torch.Generator().manual_seed(seed), condition_number=10.0)
            with torch.no_grad():
                out = m.encoder.layers[0](BlockStack.from_weights(weights))
                moved = m.encoder.layers[0](BlockStack.from_weights(g.act(weights)))
                expected = BlockStack.from_weights(TransformerWeights(SPEC, [
                    g.blocks[b].act(blk) for b, blk in enumerate(out.to_blocks())], {}, {}))
                for name in moved.tensors:
                    err = ((moved[name] - expected[name]).abs().max() / expected[name].abs().max()).item()
                    worst_layer = max(worst_layer, err)
                a, b = m.forward_logits(weights), m.forward_logits(g.act(weights))
                worst_model = max(worst_model, ((a - b).abs().max() / a.abs().max()).item())
        print(f"  {str(dtype):<14} equivariant layer {worst_layer:.2e}   whole model (invariance) {worst_model:.2e}")


if __name__ == "__main__":
    main()
