"""Each folder of the library holds at most 12 modules (its `__init__` not counted): a folder
that grows past that is split by what changes together (executor/sac: recording/, runtime/)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST = 12


def test_no_library_folder_holds_more_than_twelve_modules():
    crowded = {}
    for package in ("graph_capture", "solver", "executor", "cli"):
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MOST:
                crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert (ROOT / "executor" / "sac" / "recording").is_dir()  # the walk sees subfolders
    assert not crowded, f"folders over {MOST} modules: {crowded}"
