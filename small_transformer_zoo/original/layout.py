"""The authors' release layout, as the importer reads it and the exporter writes it.

A release is a top folder (`MNIST-Transformers/`, `AG-News-Transformers/`) holding `metadata/<dataset>.csv` and
`<dataset>/`, one `torch.save`d state_dict per checkpoint named `<run>_<epoch>_<acc>.pt` (run letters and digits;
epoch a number, or `best1` (vision) / `best` (text); acc = int(accuracy x 10,000)). The CSV has one row per
checkpoint: the run's training configuration (the original scripts' arguments), `ckpt_epoch`, `ckpt_file`
(`<dataset>/<file>`) and the test accuracy (`test_top1_accuracy` for images, `test_accuracy` for text). Vision
checkpoints hold `embedding.conv1.*` and the fixed sinusoid `embedding.pos_embedding` [tokens, d_model]; text
checkpoints hold no `embedding.*` tensor: the frozen word table and positions are in `<dataset>/embedding.pt`.
"""

from __future__ import annotations

from ..format.architecture import ArchitectureSpec

# task -> (the release's dataset name: CSV stem and checkpoint folder, its top folder)
RELEASES = {"mnist": ("mnist", "MNIST-Transformers"), "agnews": ("ag_news", "AG-News-Transformers")}
VISION_COLUMNS = ("epochs", "batch_size", "n_workers", "lr", "warmup_epochs", "optimizer", "w_init_std",
                  "l2_regularize", "train_fraction", "dropout", "seed", "dataset", "image_size", "patch_size",
                  "n_channels", "embed_dim", "n_attention_heads", "forward_mul", "n_layers", "n_classes", "model_path",
                  "data_path")
TEXT_COLUMNS = ("epochs", "batch_size", "lr", "optimizer", "w_init_std", "l2_regularize", "train_fraction",
                "dropout", "seed", "dataset", "max_len", "embed_dim", "n_attention_heads", "forward_mul", "n_layers",
                "n_classes", "model_path")
INDEX_COLUMNS = ("ckpt_epoch", "ckpt_file")


def release_names(task: str) -> tuple[str, str]:
    """(dataset, top folder) of a task's release; a task the authors did not release keeps its own name."""
    return RELEASES.get(task, (task, f"{task}-Transformers"))


def accuracy_column(spec: ArchitectureSpec) -> str:
    """The CSV's name for the test accuracy: `test_top1_accuracy` for images, `test_accuracy` for text."""
    return "test_accuracy" if spec.modality == "text" else "test_top1_accuracy"


def best_label(spec: ArchitectureSpec) -> str:
    """The epoch label of a run's best checkpoint: `best1` for images, `best` for text."""
    return "best" if spec.modality == "text" else "best1"


def config_columns(spec: ArchitectureSpec) -> tuple[str, ...]:
    return TEXT_COLUMNS if spec.modality == "text" else VISION_COLUMNS


def original_names(spec: ArchitectureSpec) -> dict[str, str]:
    """This package's tensor names -> the original module's, in the order of `spec.parameters()`."""
    names = {}
    if spec.modality == "vision":
        names |= {"embedding.patch.weight": "embedding.conv1.weight", "embedding.patch.bias": "embedding.conv1.bias"}
    attention = {"q_proj": "queries", "k_proj": "keys", "v_proj": "values", "o_proj": "out_projection"}
    for b in range(spec.num_blocks):
        names |= {f"blocks.{b}.attn.{ours}.weight": f"encoder.{b}.attention.{theirs}.weight"
                  for ours, theirs in attention.items()}
        names |= {f"blocks.{b}.mlp.{fc}.{part}": f"encoder.{b}.{fc}.{part}"
                  for fc in ("fc1", "fc2") for part in ("weight", "bias")}
    names |= {f"classifier.{fc}.{part}": f"classifier.{fc}.{part}" for fc in ("fc1", "fc2")
              for part in ("weight", "bias")}
    return {info.name: names[info.name] for info in spec.parameters()}
