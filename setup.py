"""Packaging beyond pyproject.toml: the top-level examples/ folder ships as the data package `xsim_examples`.

A package mapped from another folder cannot be expressed next to `packages.find` in pyproject.toml, so the
package list lives here; everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["traces*", "tracegen*", "replay*", "netmodels*", "xsim*"]),
        "xsim_examples",
    ],
    package_dir={"xsim_examples": "examples"},
)
