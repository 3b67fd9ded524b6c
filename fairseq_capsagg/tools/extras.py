"""The ``experiments`` extra (``setup.py``'s ``extras_require``): what the experiment drivers and the analyses'
command line use beyond the plugin's torch and numpy, checked against what is installed, so that an install of the
plugin alone says what to add instead of failing on the first import that needs it."""

from importlib import metadata
from typing import List

from packaging.requirements import Requirement

DISTRIBUTION = "fairseq-capsagg"
EXTRA = "experiments"


def missing_from_extra() -> List[str]:
    """The distributions of the ``experiments`` extra that are not installed; none where this package is not
    installed (a source tree on the path: no metadata to check against)."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": EXTRA}):
            continue
        try:
            metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(requirement.name)
    return missing


def require_extra(what: str) -> None:
    """Stops ``what`` before it imports a package of the extra that is not installed.

    Raises:
        ImportError: naming the missing distributions and the install command.
    """
    missing = missing_from_extra()
    if missing:
        raise ImportError(f"{what} needs the '{EXTRA}' extra, which is not installed (missing: {', '.join(missing)}); "
                          f"in the clone: pip install '.[{EXTRA}]'")
