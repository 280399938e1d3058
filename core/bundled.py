"""Find instance and plan files shipped in `hetplan.instances` by short name."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from hetplan.errors import InstanceError

DEFAULT_INSTANCE = "a100_v100_one_zone"


def bundled_dir() -> Path:
    return Path(str(resources.files("hetplan.instances")))


def bundled_instances() -> list[str]:
    return sorted(p.stem for p in bundled_dir().glob("*.yaml"))


def bundled_instance_path(name: str) -> Path:
    """'a100_v100_one_zone' or 'a100_v100_one_zone.yaml' -> the bundled file; clear error otherwise."""
    stem = Path(name).name.removesuffix(".yaml").removesuffix(".yml").removesuffix(".json")
    candidate = bundled_dir() / f"{stem}.yaml"
    if candidate.exists():
        return candidate
    raise InstanceError(f"file not found: {name} (and no bundled instance of that name; bundled: {bundled_instances()})")


def bundled_plan_path(name: str) -> Path:
    stem = Path(name).name.removesuffix(".json")
    candidate = bundled_dir() / "plans" / f"{stem}.json"
    if candidate.exists():
        return candidate
    raise InstanceError(f"file not found: {name} (and no bundled plan of that name)")
