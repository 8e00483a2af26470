"""Deployment errors: one class per failure, all under SpecpairError."""

from __future__ import annotations

from specpair.errors import SpecpairError

__all__ = ["DeployError", "ReleaseError", "InventoryError", "ImageNotFound", "RecordsDisagree"]


class DeployError(SpecpairError):
    """Base of the deployment errors."""


class ReleaseError(DeployError, ValueError):
    """A release file is missing, unreadable or has a bad field."""


class InventoryError(DeployError, ValueError):
    """An inventory name or path does not name an inventory directory."""


class ImageNotFound(DeployError):
    """A release image reference is not present in the local Docker engine."""


class RecordsDisagree(DeployError):
    """The hosts' release records disagree and no interrupted move explains it."""
