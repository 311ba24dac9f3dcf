"""Text corpora: the installed GCIDE dictionary and text / JSON-lines / gzip files (px::data)."""

from ._core._data import gcide_path, read_documents, read_gcide  # noqa: F401
