"""The console's building blocks, each one idea: bars, banners, the step rail, JSON, attempts."""

from .attempts import AttemptsView
from .bulk_bar import BulkBar
from .crumbs import Crumbs
from .database_banner import DatabaseBanner
from .filter_input import FilterInput
from .json_view import JsonView
from .reload_banner import ReloadBanner
from .sparkline import sparkline
from .step_rail import StepRail

__all__ = [
    "AttemptsView",
    "BulkBar",
    "Crumbs",
    "DatabaseBanner",
    "FilterInput",
    "JsonView",
    "ReloadBanner",
    "StepRail",
    "sparkline",
]
