"""Every exception class of patchbay is in ``driver.errors`` and in its tree.

``driver.errors`` is the one place a reader looks for what can go wrong and
which exit code it ends a process with. This test imports every module of
``driver``, ``plugin`` and ``fabric`` and fails on an exception class that
does not derive from :class:`driver.errors.PatchbayError`, that lives
elsewhere without being listed below, or that the docstring's tree leaves
out.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from driver import errors

# Defined beside what it needs, outside driver/ (driver never imports it).
ELSEWHERE = {"fabric.service.errors.RedfishError", "fabric.service.count_wire.FmError"}


def exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in ("driver", "plugin", "fabric"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == info.name:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_derives_from_the_root_and_lives_in_driver_errors() -> None:
    found = exception_classes()
    assert "driver.errors.HotplugError" in found
    assert [n for n, c in found.items() if not issubclass(c, errors.PatchbayError)] == []
    assert sorted(n for n in found if not n.startswith("driver.errors.")) == sorted(ELSEWHERE)


def test_the_docstring_tree_names_every_error() -> None:
    doc = errors.__doc__ or ""
    missing = [n for n, c in exception_classes().items() if c.__name__ not in doc]
    assert missing == []
    for name in ELSEWHERE:
        assert name in doc


def test_the_root_holds_one_class_per_kind_and_each_feature_its_own_subtree() -> None:
    found = exception_classes()
    children = sorted(c.__name__ for c in errors.PatchbayError.__subclasses__())
    assert children == [
        "ApiError", "ClaimError", "ConfigError", "DeviceError", "DiscoveryError",
        "FabricError", "LeaseLost", "NodeStateError", "Stopped", "WireError",
    ]  # fmt: skip
    fabric = [n for n, c in found.items() if "Fabric" in n or "Attach" in n or "Redfish" in n]
    assert fabric and all(issubclass(found[n], errors.FabricError) for n in fabric)
    assert issubclass(errors.CdiError, errors.NodeStateError)
    assert issubclass(errors.CheckpointError, errors.NodeStateError)
