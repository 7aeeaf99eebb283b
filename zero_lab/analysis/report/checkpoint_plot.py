"""`zero-lab checkpoint inspect DIR --plot FILE`: what each file of a DeepSpeed checkpoint holds, one
stacked bar per file, by the role of its tensors (each storage counted once: a tied embedding and
head is one tensor on disk):

    parameters (module)     the model states file's whole parameters (stages 0-2; stage 3 writes them empty)
    fp32 master partition   an optimizer file's fp32 partition (official's `single_partition_of_fp32_groups`
                            at stages 0-2, `fp32_flat_groups` at stage 3)
    Adam exp_avg, exp_avg_sq  the two moments of that partition
    other                   every other tensor (Adam's step counts, buffers)

Phase 1: `picture_numbers` walks each file's tree (`nano.checkpoint.files.read_file`'s result).
Phase 2: `draw` lays the bars out; `analysis.report.picture` saves the PNG with the numbers inside.
"""

from __future__ import annotations

import os
from pathlib import Path

from zero_lab.analysis.report.picture import MB, draw_picture

ROLES = {"parameters (module)": "#4C72B0", "fp32 master partition": "#55A868", "Adam exp_avg": "#C44E52",
         "Adam exp_avg_sq": "#E39A9C", "other": "#8C8C8C"}
FP32_KEYS = ("single_partition_of_fp32_groups", "fp32_flat_groups")


def role(path: tuple[str, ...]) -> str:
    if path and path[0] == "module":
        return "parameters (module)"
    if any(key in FP32_KEYS for key in path):
        return "fp32 master partition"
    for moment in ("exp_avg_sq", "exp_avg"):
        if moment in path:
            return f"Adam {moment}"
    return "other"


def tensor_bytes(tree, path: tuple[str, ...] = (), seen: set | None = None, found: dict | None = None) -> dict[str, int]:
    """Bytes of the tensors under `tree` by role, each storage once."""
    import torch

    seen = set() if seen is None else seen
    found = dict.fromkeys(ROLES, 0) if found is None else found
    if isinstance(tree, torch.Tensor):
        storage = tree.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            found[role(path)] += storage.nbytes()
    elif isinstance(tree, dict):
        for key, value in tree.items():
            tensor_bytes(value, (*path, str(key)), seen, found)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            tensor_bytes(value, path, seen, found)
    return found


def picture_numbers(checkpoint) -> dict:
    """Phase 1: per file of the tag (the model states, then each rank's optimizer file), bytes by role."""
    saved = checkpoint.saved
    parameters = sum(shape.numel() for shape in checkpoint.shapes().values())
    files = [(os.path.basename(checkpoint.model_path), checkpoint.model_states)]
    files += [(os.path.basename(path), content) for path, content in zip(checkpoint.optimizer_paths,
                                                                         checkpoint.optimizer_files)]
    return {"title": f"{checkpoint.tag}: stage {saved.stage}, {saved.world_size} ranks, {checkpoint.precision}, "
                     f"{parameters:,} parameters (zero-lab checkpoint inspect)",
            "files": [{"name": name, "bytes": tensor_bytes(content)} for name, content in files]}


def short_name(name: str) -> str:
    """'zero_pp_rank_1_mp_rank_00_optim_states.pt' -> 'rank 1\\noptimizer'; the model states file likewise."""
    kind = "optimizer" if "optim_states" in name else "model states"
    rank = name.split("zero_pp_rank_")[1].split("_")[0] if "zero_pp_rank_" in name else None
    return f"rank {rank}\n{kind}" if rank is not None else kind


def draw(numbers: dict):
    """Phase 2: one stacked bar per file, its total MB on top."""
    files = numbers["files"]

    def on(figure) -> None:
        axes = figure.add_axes((0.1, 0.26, 0.87, 0.62))
        bottoms = [0.0] * len(files)
        for name, colour in ROLES.items():
            heights = [entry["bytes"][name] / MB for entry in files]
            if any(heights):
                axes.bar(range(len(files)), heights, 0.6, bottom=bottoms, color=colour, label=name)
                bottoms = [low + height for low, height in zip(bottoms, heights)]
        for position, total in enumerate(bottoms):
            axes.text(position, total, f"{total:.2f}", ha="center", va="bottom", fontsize=7)
        axes.set_xticks(range(len(files)))
        axes.set_xticklabels([short_name(entry["name"]) for entry in files])
        axes.set_ylim(0, max(bottoms) * 1.15 or 1)
        axes.set_ylabel("MB of tensors in the file")
        axes.spines[["top", "right"]].set_visible(False)
        axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        axes.set_title(numbers["title"], loc="left")
    return on


def plot_checkpoint(checkpoint, path: Path) -> Path:
    numbers = picture_numbers(checkpoint)
    return draw_picture(path, max(7.5, 1.3 * len(numbers["files"]) + 2.5), 4.6, draw(numbers), numbers)
