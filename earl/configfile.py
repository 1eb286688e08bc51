"""Moved to earl.config (the one configuration machinery); kept until the scenario reader moves."""

from earl.config import SUFFIXES
from earl.config import read_mapping as read_mapping_file

__all__ = ["SUFFIXES", "read_mapping_file"]
