"""Packaging beyond pyproject.toml: the top-level examples/ folder ships as the data package `xsim_examples`.

A package mapped from another folder cannot be expressed next to `packages.find` in pyproject.toml, so the
package list lives here; everything else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        # Namespace discovery also lists the data folders (tracegen/data, traces/examples/...) that
        # package-data ships, which setuptools otherwise warns are "absent from the packages configuration".
        *find_namespace_packages(
            include=["traces*", "tracegen*", "replay*", "netmodels*", "xsim*"], exclude=["*__pycache__*"]
        ),
        "xsim_examples",
    ],
    package_dir={"xsim_examples": "examples"},
)
