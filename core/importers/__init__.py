"""Importers for other planners' measurement files (Sailor, Metis) into hetplan's data model.

`load_profiles(path, fmt, gpu_type)` is the one entry point the profile estimator uses for a
`ProfileRef`; the format modules expose the individual parsers.
"""
from __future__ import annotations

from pathlib import Path

from hetplan.errors import InstanceError
from hetplan.profiles import ProfileSet, load_hetplan_profile

__all__ = ["load_profiles"]


def load_profiles(path: str | Path, fmt: str, gpu_type: str, *, llm_info: str | Path | None = None,
                  model: str | None = None, metis_fwd_fraction: float | None = None) -> ProfileSet:
    """Read the profile of `gpu_type` from `path` in format sailor | metis | hetplan.

    sailor: `path` is a profile.json; memory comes from `llm_info` (Sailor's llm_info.json) when given,
    for `model` (Sailor's model name; defaults to the profile's folder name).
    metis: `path` is a directory of DeviceType.<gpu>_tp<k>_bs<b>.json files (or one such file).
    hetplan: `path` is a hetplan-format JSON file.
    The result holds one profile, labelled `gpu_type`.
    """
    if fmt == "sailor":
        from hetplan.importers.sailor import read_sailor_profile

        return ProfileSet((read_sailor_profile(path, gpu_type=gpu_type, model=model, llm_info=llm_info),))
    if fmt == "metis":
        from hetplan.importers.metis import DEFAULT_FWD_FRACTION, read_metis_profile_for

        fraction = DEFAULT_FWD_FRACTION if metis_fwd_fraction is None else metis_fwd_fraction
        return ProfileSet((read_metis_profile_for(path, gpu_type, fwd_fraction=fraction),))
    if fmt == "hetplan":
        return load_hetplan_profile(path, gpu_type)
    raise InstanceError(f"unknown profile format {fmt!r}; known: sailor, metis, hetplan", "format")
