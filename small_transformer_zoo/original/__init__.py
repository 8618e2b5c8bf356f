"""Import of the authors' released zoo (`stz import-original`): folder, zip or Hub zip, in this format."""

from .importer import ImportResult, import_original
from .index import parse_checkpoint_name

__all__ = ["ImportResult", "import_original", "parse_checkpoint_name"]
