"""Training data: corpora that need no download, tokenization and packing."""

from .corpus import ByteTokenizer, read_text_sources, stdlib_corpus
from .packed import PackedTokens
from .sources import read_documents, tokenize_documents

__all__ = ["ByteTokenizer", "PackedTokens", "read_text_sources", "stdlib_corpus", "read_documents",
           "tokenize_documents"]
