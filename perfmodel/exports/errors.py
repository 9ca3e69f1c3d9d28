"""The one error an exporter raises, apart from the package that dispatches to the writers."""

from perfmodel.hardware_db.errors import SpecError


class ExportError(SpecError):
    """The plan is valid but the framework cannot express it (an offload tier, a parallelism it lacks)."""
