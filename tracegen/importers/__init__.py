"""Importers of real profiles as Chakra trace sets (one sub-package per source; today PyTorch)."""
