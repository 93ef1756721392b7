"""The three custom resources, as pydantic models: the single source of the CRDs, the operator's parsing and rendering."""
from .group import API_GROUP, API_VERSION, KINDS
