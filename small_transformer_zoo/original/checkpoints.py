"""The release's `.pt` files: safe loading, the architecture they hold, and their tensors under this format's names.

Every file goes through `torch.load(weights_only=True)`, so a pickle that would run code or build other objects is
refused before anything in it executes. The vision state_dicts name their tensors `embedding.conv1.*`,
`encoder.<i>.attention.{queries,keys,values,out_projection}.weight`, `encoder.<i>.fc1/fc2.*` and
`classifier.fc1/fc2.*`; they also carry the fixed sinusoid `embedding.pos_embedding`, which is the same in every
file and is stored once. Text checkpoints hold no `embedding.*` tensors: the frozen word table and positions are in
`<dataset>/embedding.pt` (`embedding.embedding.weight`, `embedding.pos_embedding`).
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Mapping
from typing import Any

import torch

from ..format.architecture import ArchitectureSpec
from ..errors import ZooDamagedError
from ..weights.model import sinusoidal_positions

POSITIONS = "embedding.pos_embedding"
WORD_TABLE = "embedding.embedding.weight"
PAPER_HEADS = 2
_ATTENTION = {"queries": "q_proj", "keys": "k_proj", "values": "v_proj", "out_projection": "o_proj"}
_NAME = re.compile(r"^(?:embedding\.conv1\.(?P<patch>weight|bias)"
                   r"|encoder\.(?P<block>\d+)\.(?:attention\.(?P<attn>queries|keys|values|out_projection)\.weight"
                   r"|(?P<fc>fc[12])\.(?P<fc_part>weight|bias))"
                   r"|classifier\.(?P<head>fc[12]\.(?:weight|bias)))$")


def load_state_dict(data: bytes, where: str) -> dict[str, torch.Tensor]:
    """A `torch.save`d state_dict of tensors, loaded without executing anything; anything else is refused."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise ZooDamagedError(where, f"refused: holds objects other than tensors, and nothing of it was run "
                                    f"({first_line})") from None
    except Exception as exc:  # torch raises many types for damaged files
        first_line = (str(exc).splitlines() or [""])[0]
        raise ZooDamagedError(where, f"cannot be read by torch.load ({type(exc).__name__}: {first_line})") from None
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in state.items()):
        raise ZooDamagedError(where, f"holds a {type(state).__name__}, not a state_dict of named tensors")
    for name, tensor in state.items():
        if tensor.layout != torch.strided or tensor.dtype != torch.float32:
            raise ZooDamagedError(where, f"tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')} "
                                        f"({str(tensor.layout).removeprefix('torch.')}); the zoo stores dense float32 "
                                        f"weights, and converting it would change them")
    return dict(state)


def zoo_name(original: str) -> str | None:
    """This format's name for a release tensor name, or None for a name the release does not use."""
    match = _NAME.match(original)
    if match is None:
        return None
    if match["patch"]:
        return f"embedding.patch.{match['patch']}"
    if match["attn"]:
        return f"blocks.{match['block']}.attn.{_ATTENTION[match['attn']]}.weight"
    if match["fc"]:
        return f"blocks.{match['block']}.mlp.{match['fc']}.{match['fc_part']}"
    return f"classifier.{match['head']}"


def position_table(tensor: torch.Tensor, where: str) -> torch.Tensor:
    """A saved position table as [tokens, d_model] (leading axes of size 1 dropped)."""
    table = tensor.detach().to(torch.float32)
    while table.dim() > 2 and table.shape[0] == 1:
        table = table[0]
    if table.dim() != 2:
        raise ZooDamagedError(where, f"{POSITIONS} has shape {tuple(tensor.shape)}, not [tokens, d_model]")
    return table


def infer_spec(state: Mapping[str, torch.Tensor], frozen: Mapping[str, torch.Tensor], columns: Mapping[str, set[Any]],
               where: str) -> ArchitectureSpec:
    """The architecture of a release from one checkpoint, the frozen tables and the CSV's architecture columns.

    Head count is not visible in the shapes: it comes from the CSV's `n_attention_heads`, else the paper's 2."""
    def one(column: str) -> Any:
        values = columns.get(column, set()) - {None}
        if len(values) > 1:
            raise ZooDamagedError(where, f"column {column!r} takes several values {sorted(map(str, values))}; a zoo "
                                        f"has one architecture")
        return next(iter(values), None)

    try:
        queries = state["encoder.0.attention.queries.weight"]
        hidden = state["encoder.0.fc1.weight"]
        head = state["classifier.fc2.weight"]
    except KeyError as exc:
        raise ZooDamagedError(where, f"lacks tensor {exc.args[0]!r}: not a checkpoint of the release's transformer; "
                                    f"names seen: {sorted(state)[:6]}") from None
    inner, d_model = queries.shape
    blocks = len({name.split(".")[1] for name in state if name.startswith("encoder.")})
    heads = int(one("n_attention_heads") or PAPER_HEADS)
    if inner % heads:
        raise ZooDamagedError(where, f"{inner} attention features do not split into {heads} heads")
    positions = frozen[POSITIONS]
    common = dict(num_classes=int(head.shape[0]), d_model=int(d_model), num_heads=heads, d_head=inner // heads,
                  d_mlp=int(hidden.shape[0]), num_blocks=blocks)
    if "embedding.conv1.weight" in state:
        _, channels, patch, _ = state["embedding.conv1.weight"].shape
        side = int(round(positions.shape[0] ** 0.5)) * int(patch)
        spec = ArchitectureSpec(modality="vision", image_size=int(one("image_size") or side), in_channels=int(channels),
                                patch_size=int(patch), **common)
    else:
        spec = ArchitectureSpec(modality="text", vocab_size=int(frozen[WORD_TABLE].shape[0]),
                                max_length=int(positions.shape[0]), **common)
    stated = {"embed_dim": spec.d_model, "n_layers": spec.num_blocks, "forward_mul": spec.d_mlp / spec.d_model}
    if spec.modality == "vision":
        stated |= {"patch_size": spec.patch_size, "n_channels": spec.in_channels}
    for column, value in stated.items():
        said = one(column)
        if said is not None and str(said) != str(value) and not _same_number(said, value):
            raise ZooDamagedError(where, f"column {column!r} says {said}, the checkpoint files hold {value}")
    if tuple(positions.shape) != (spec.num_tokens, spec.d_model):
        raise ZooDamagedError(where, f"{POSITIONS} has shape {tuple(positions.shape)}; the architecture has "
                                    f"{spec.num_tokens} tokens of {spec.d_model}")
    return spec


def _same_number(said: Any, value: float) -> bool:
    try:
        return float(said) == float(value)
    except (TypeError, ValueError):
        return False


def zoo_weights(state: Mapping[str, torch.Tensor], frozen: Mapping[str, torch.Tensor],
                where: str) -> dict[str, torch.Tensor]:
    """One checkpoint's trainable tensors under this format's names; the frozen ones must equal the shared copy."""
    out, unknown = {}, []
    for name, tensor in state.items():
        if name in frozen:
            shared = frozen[name]
            if not torch.equal(position_table(tensor, where) if name == POSITIONS else tensor, shared):
                raise ZooDamagedError(where, f"{name} differs from the release's shared copy; it is fixed in "
                                            f"every checkpoint of the release")
            continue
        ours = zoo_name(name)
        if ours is None:
            unknown.append(name)
        else:
            out[ours] = tensor
    if unknown:
        raise ZooDamagedError(where, f"holds tensors the release's transformer does not have: {unknown[:5]}")
    return out


def frozen_tables(first: Mapping[str, torch.Tensor], embedding: Mapping[str, torch.Tensor] | None,
                  first_where: str, embedding_where: str | None) -> dict[str, torch.Tensor]:
    """The fixed tables of a release: vision positions from its first checkpoint, text ones from embedding.pt."""
    if embedding is not None:
        missing = [k for k in (WORD_TABLE, POSITIONS) if k not in embedding]
        if missing:
            raise ZooDamagedError(embedding_where, f"lacks {missing}; holds {sorted(embedding)}")
        return {WORD_TABLE: embedding[WORD_TABLE].detach().to(torch.float32),
                POSITIONS: position_table(embedding[POSITIONS], str(embedding_where))}
    if POSITIONS not in first:
        raise ZooDamagedError(first_where, f"holds no {POSITIONS} and the release has no embedding.pt: neither a "
                                          f"vision nor a text checkpoint of the release")
    return {POSITIONS: position_table(first[POSITIONS], first_where)}


def positions_match_model(spec: ArchitectureSpec, positions: torch.Tensor) -> bool:
    """Whether the release's position table is the sinusoid this package's model adds."""
    return torch.allclose(positions, sinusoidal_positions(spec.num_tokens, spec.d_model), atol=1e-5)
